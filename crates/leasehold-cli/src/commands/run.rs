//! `leasehold run`: a command run while holding a lease, as [`crate::process::under_lease`] runs it.

use crate::cli::RunArgs;
use crate::exit::{Failure, LOST};
use crate::lease::{lease_builder, obtain, Ended};
use crate::metrics::{self, Endpoint};
use crate::process::signals::Forwarded;
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
    let (key, loss) = (held.key, held.loss);
    // From here on SIGTERM/SIGINT/SIGHUP are ours to handle: while waiting they end the wait,
    // while the command runs they are forwarded to it.
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let endpoint = Endpoint::given(args.lease.metrics);
    let locks = metrics::locks(store_url, endpoint.as_ref()).await?;
    Endpoint::serve_given(endpoint).await?;
    let builder = lease_builder(&locks, &key, &args.lease)?.loss_grace(held.lease_loss_grace);
    let guard = obtain(builder, &key, args.lease.no_wait, &mut signals).await?;
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
