//! Runs the parsed command line: the runtime, dispatch to the subcommands.

use crate::cli::{Cli, Command};
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
    let command = match valid.command {
        Checked::Run {
            args,
            held,
            program,
        } => return run::run(url, args, held, program).await,
        Checked::Hold(args, held) => return hold::hold(url, args, held).await,
        Checked::Elect(args, held) => return elect::elect(url, args, held).await,
        Checked::Torture(plan) => return torture::torture(plan).await,
        Checked::Ls { prefix, json } => {
            return admin::ls(&*store::open(url).await?, &prefix, json).await
        }
        Checked::Inspect { key, json } => {
            return admin::inspect(&*store::open(url).await?, key, json).await
        }
        Checked::Watch { key, json, every } => {
            return admin::watch(&*store::open(url).await?, key, json, every).await
        }
        Checked::Release { key, holder } => {
            return admin::release(&*store::open(url).await?, key, holder.as_deref()).await
        }
        Checked::Serve {
            args,
            prefix,
            token,
        } => return serve::serve(url, args, prefix, token).await,
        Checked::Bench(args) => return bench::bench(store::open(url).await?, args).await,
        Checked::QueueAdd { queue, args, argv } => {
            return queue::add(&*store::open_queue(queue.as_deref()).await?, args, argv).await
        }
        Checked::Other(command) => command,
    };
    match command {
        Command::Run(_)
        | Command::Elect(_)
        | Command::Hold(_)
        | Command::Ls(_)
        | Command::Inspect(_)
        | Command::Watch(_)
        | Command::Release(_)
        | Command::Bench(_)
        | Command::Serve(_)
        | Command::Torture(_) => unreachable!("checked into a plan"),
        Command::Cleanup(args) => admin::cleanup(&*store::open(url).await?, args).await,
        Command::Queue(args) => queue::dispatch(url, args).await,
    }
}
