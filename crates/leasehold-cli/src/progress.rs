//! Progress of the long-running commands (`torture`, `bench`): a bar on stderr when stderr is a
//! terminal, nothing when it is piped or redirected (logs and scripts get the results only).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A bar of `len` steps drawn with `template` (indicatif's template language), hidden unless
/// stderr is a terminal and `shown` (a command's `--json` output hides it too).
pub(crate) fn bar(len: u64, template: &str, shown: bool) -> ProgressBar {
    let target = if shown && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    // A template that does not parse is this program's defect: the default style still shows
    // the progress.
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}
