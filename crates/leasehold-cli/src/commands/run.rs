//! `leasehold run`: a command run while holding a lease, as [`crate::process::under_lease`] runs it.

use crate::cli::RunArgs;
use crate::exit::{Failure, LOST};
use crate::lease::{take, Ended};
use crate::process::under_lease::{supervise, Supervised};
use crate::valid::Held;
use std::ffi::OsString;

/// `leasehold run`: `program` with the arguments of `args.command` under the lease `held`.
pub(crate) async fn run(
    store_url: Option<&str>,
    args: RunArgs,
    held: Held,
    program: OsString,
) -> Result<u8, Failure> {
    // While the command runs, the signals are forwarded to it.
    let (mut signals, locks, guard) = take(store_url, &args.lease, &held).await?;
    let (key, loss) = (held.key, held.loss);
    let command = Supervised {
        program: &program,
        args: &args.command,
        grace: args.grace,
        loss,
        on_handoff: args.on_handoff,
    };
    match supervise(&locks, &guard, &key, &command, &mut signals).await? {
        Ended::Status(code) => Ok(code),
        Ended::Lost(_) => Ok(LOST),
    }
}
