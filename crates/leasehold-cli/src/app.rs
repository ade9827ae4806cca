//! Runs the parsed command line: the runtime, dispatch to the subcommands.

use crate::cli::{key_arg, prefix_arg, Cli, Command};
use crate::commands::{admin, bench, elect, hold, queue, run, serve, torture};
use crate::exit::{self, Failure, ERROR};
use crate::setup::runtime;
use crate::store;
use std::time::Duration;

/// Runs the command and returns leasehold's exit code; failures are reported on stderr.
pub(crate) fn main(cli: Cli) -> u8 {
    let Some(runtime) = runtime() else {
        return ERROR;
    };
    let result = runtime.block_on(async {
        let result = dispatch(cli).await;
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

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let url = cli.store.as_deref();
    match cli.command {
        Command::Run(args) => run::run(url, args).await,
        Command::Elect(args) => elect::elect(url, args).await,
        Command::Hold(args) => hold::hold(url, args).await,
        Command::Ls(args) => {
            let prefix = prefix_arg(args.prefix.as_deref())?;
            admin::ls(&*store::open(url).await?, &prefix, args.json).await
        }
        Command::Inspect(args) => {
            let key = key_arg(&args.key)?;
            admin::inspect(&*store::open(url).await?, key, args.json).await
        }
        Command::Bench(args) => bench::bench(store::open(url).await?, args).await,
        Command::Watch(args) => {
            let key = key_arg(&args.key)?;
            admin::watch(&*store::open(url).await?, key, args.json, args.every).await
        }
        Command::Release(args) => {
            admin::check_force(&args)?;
            let key = key_arg(&args.key)?;
            admin::release(&*store::open(url).await?, key, args.holder.as_deref()).await
        }
        Command::Cleanup(args) => admin::cleanup(&*store::open(url).await?, args).await,
        Command::Queue(args) => queue::dispatch(url, args).await,
        Command::Serve(args) => serve::serve(url, args).await,
        Command::Torture(args) => torture::torture(url, args).await,
    }
}
