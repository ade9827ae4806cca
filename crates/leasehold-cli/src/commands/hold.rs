//! `leasehold hold`: hold a lease for as long as whoever started it keeps its stdin open — for a
//! shell script that runs several commands under one lease (a coprocess), or a process that is
//! not a child of leasehold. The lease is released when stdin reaches end-of-file (the script
//! closed it, or died) or on SIGTERM, SIGINT or SIGHUP, as `elect` without a command releases it
//! ([`hold_until`]). When renewals fail, the script is told `stop KEY MS` at the stop-by deadline
//! (the `--loss-grace` and SIGKILL margin before the lease could expire), and `lost` at expiry.

use crate::cli::HoldArgs;
use crate::exit::{Failure, LOST};
use crate::lease::{hold_until, take, Ended, Events};
use crate::valid::Held;
use tokio::io::AsyncReadExt;

/// `leasehold hold`.
pub(crate) async fn hold(
    store_url: Option<&str>,
    args: HoldArgs,
    held: Held,
) -> Result<u8, Failure> {
    // The renewals run while `_locks` lives: to the end of the hold.
    let (mut signals, _locks, guard) = take(store_url, &args.lease, &held).await?;
    let key = held.key;
    let events = Events {
        json: args.json,
        to_stdout: true,
    };
    events.obtained("held", &key, &guard)?;
    // End-of-file (or a read error: either way, nobody is there any more) ends the hold.
    let closed = async {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 4096];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    let stop = async {
        tokio::select! {
            () = closed => {}
            _ = signals.recv() => {}
        }
    };
    match hold_until(&guard, &key, &events, stop).await? {
        Ended::Lost(reason) => {
            events.lost(&key, &reason)?;
            Ok(LOST)
        }
        Ended::Status(code) => Ok(code),
    }
}
