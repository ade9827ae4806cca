//! `leasehold run`: a command run while holding a lease, as [`crate::process::under_lease`] runs it.

use crate::cli::{key_arg, RunArgs};
use crate::exit::{Failure, LOST};
use crate::lease::{lease_builder, obtain, Ended};
use crate::metrics::{self, Endpoint};
use crate::process::loss::Loss;
use crate::process::signals::Forwarded;
use crate::process::under_lease::{supervise, Supervised};

/// `leasehold run`.
pub(crate) async fn run(store_url: Option<&str>, args: RunArgs) -> Result<u8, Failure> {
    let key = key_arg(&args.lease.key)?;
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Failure::usage(
            "no command to run: leasehold run --key KEY -- CMD [ARGS...]",
        ));
    };
    // From here on SIGTERM/SIGINT/SIGHUP are ours to handle: while waiting they end the wait,
    // while the command runs they are forwarded to it.
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let endpoint = Endpoint::given(args.lease.metrics);
    let locks = metrics::locks(store_url, endpoint.as_ref()).await?;
    Endpoint::serve_given(endpoint).await?;
    let (loss, lease_loss_grace) =
        Loss::for_lease(args.lease.ttl, args.lease.loss_grace, args.overlap_grace)?;
    let builder = lease_builder(&locks, &key, &args.lease)?.loss_grace(lease_loss_grace);
    let guard = obtain(builder, &key, args.lease.no_wait, &mut signals).await?;
    let command = Supervised {
        program,
        args: program_args,
        grace: args.grace,
        loss,
        on_handoff: args.on_handoff,
    };
    match supervise(&locks, &guard, &key, &command, &mut signals).await? {
        Ended::Status(code) => Ok(code),
        Ended::Lost(_) => Ok(LOST),
    }
}
