//! Runs the parsed command line: the runtime, dispatch to the subcommands.

use crate::cli::Cli;
use crate::commands::{admin, bench, elect, hold, queue, run, serve, torture};
use crate::exit::{self, Failure, ERROR};
use crate::setup::runtime;
use crate::store;
use crate::valid::{Checked, Valid};
use std::time::Duration;

/// Runs the command and returns leasehold's exit code; failures are reported on stderr.
pub(crate) fn main(cli: Cli) -> u8 {
    let valid = match Valid::check(cli) {
        Ok(v) => v,
        Err(failure) => {
            exit::report(&failure.message);
            return failure.code;
        }
    };
    let Some(runtime) = runtime() else {
        return ERROR;
    };
    let result = runtime.block_on(async {
        let result = dispatch(valid).await;
        // What cancelled waits and dropped guards left to the background (withdrawing a waiter
        // registration, a release) finishes before the runtime goes: a signalled candidate must
        // not keep the lease reserved for itself after it exits.
        leasehold::settle(Duration::from_secs(1)).await;
        result
    });
    // Leases are released explicitly before this point; do not hang on a stuck store call.
    runtime.shutdown_timeout(Duration::from_millis(500));
    match result {
        Ok(code) => code,
        Err(failure) => {
            exit::report(&failure.message);
            failure.code
        }
    }
}

async fn dispatch(valid: Valid) -> Result<u8, Failure> {
    let url = valid.store.as_deref();
    match valid.command {
        Checked::Run {
            args,
            held,
            program,
        } => run::run(url, args, held, program).await,
        Checked::Hold(args, held) => hold::hold(url, args, held).await,
        Checked::Elect(args, held) => elect::elect(url, args, held).await,
        Checked::Torture(plan) => torture::torture(plan).await,
        Checked::Ls { prefix, json } => admin::ls(&*store::open(url).await?, &prefix, json).await,
        Checked::Inspect { key, json } => {
            admin::inspect(&*store::open(url).await?, key, json).await
        }
        Checked::Watch { key, json, every } => {
            admin::watch(&*store::open(url).await?, key, json, every).await
        }
        Checked::Release { key, holder } => {
            admin::release(&*store::open(url).await?, key, holder.as_deref()).await
        }
        Checked::Serve {
            args,
            prefix,
            token,
        } => serve::serve(url, args, prefix, token).await,
        Checked::Bench(args) => bench::bench(store::open(url).await?, args).await,
        Checked::Cleanup(args) => admin::cleanup(&*store::open(url).await?, args).await,
        Checked::QueueAdd { queue, args, argv } => {
            queue::add(&*store::open_queue(queue.as_deref()).await?, args, argv).await
        }
        Checked::Queue(args) => queue::dispatch(url, args).await,
    }
}
