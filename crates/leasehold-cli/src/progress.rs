//! Progress of the long-running commands (`torture`, `bench`, `queue work`, `cleanup`): a bar on stderr when stderr is a
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

/// Runs `work` to its end while `bar` shows `(position, length)` as `poll` reads them, ten times
/// a second; only `work` runs when the bar is hidden.
pub(crate) async fn follow<T>(
    bar: &ProgressBar,
    work: impl std::future::Future<Output = T>,
    poll: impl Fn() -> (u64, u64),
) -> T {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick(), if !bar.is_hidden() => {
                let (pos, len) = poll();
                bar.set_length(len);
                bar.set_position(pos);
            }
        }
    }
}
