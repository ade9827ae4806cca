//! Progress of the long-running commands (`torture`, `bench`, `queue work`, `cleanup`): a bar on stderr when stderr is a
//! terminal, nothing when it is piped or redirected (logs and scripts get the results only).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A bar of `len` steps drawn with `template` (indicatif's template language), hidden unless
/// stderr is a terminal and `shown` (a command's `--json` output hides it too).
pub(crate) fn bar(len: u64, template: &str, shown: bool) -> ProgressBar {
    styled(Some(len), template, shown, "")
}

/// A spinner with `message` and the time so far, for work whose size is not known ahead, hidden
/// unless stderr is a terminal.
pub(crate) fn spinner(message: &str) -> ProgressBar {
    styled(None, "{spinner} {msg} {elapsed}", true, message)
}

fn styled(len: Option<u64>, template: &str, shown: bool, message: &str) -> ProgressBar {
    let target = if shown && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(len, target);
    // A template that does not parse is this program's defect: the default style still shows
    // the progress.
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message.to_owned());
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}
