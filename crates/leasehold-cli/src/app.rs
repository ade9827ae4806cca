//! Runs the parsed command line: logging, the runtime, dispatch to the subcommands.

use crate::cli::{Cli, Command};
use crate::exit::{self, Failure, ERROR};
use crate::{admin, bench, elect, hold, queue, run, store};
use std::io::IsTerminal;
use std::time::Duration;
use tracing_subscriber::EnvFilter;

/// The log filter when `LEASEHOLD_LOG` is not set. The library's own "lease lost" warning is left
/// out: `run` reports a loss itself, on one line.
const DEFAULT_LOG: &str = "warn,leasehold::guard=error";

/// Sets up logging to stderr, filtered by `LEASEHOLD_LOG` (default: warnings).
pub(crate) fn init_logging() {
    let filter = match std::env::var("LEASEHOLD_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            exit::report(&format!("ignoring LEASEHOLD_LOG={spec:?}: {e}"));
            EnvFilter::new(DEFAULT_LOG)
        }),
        _ => EnvFilter::new(DEFAULT_LOG),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// The single-threaded runtime leasehold runs on; `None` (told on stderr) if it cannot start.
pub(crate) fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            exit::report(&format!("cannot start the async runtime: {e}"));
            None
        }
    }
}

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
            let prefix = admin::prefix_arg(args.prefix.as_deref())?;
            admin::ls(&*store::open(url).await?, &prefix, args.json).await
        }
        Command::Inspect(args) => {
            let key = admin::key_arg(&args.key)?;
            admin::inspect(&*store::open(url).await?, key, args.json).await
        }
        Command::Bench(args) => bench::bench(store::open(url).await?, args).await,
        Command::Watch(args) => {
            let key = admin::key_arg(&args.key)?;
            admin::watch(&*store::open(url).await?, key, args.json, args.every).await
        }
        Command::Release(args) => {
            admin::check_force(&args)?;
            let key = admin::key_arg(&args.key)?;
            admin::release(&*store::open(url).await?, key).await
        }
        Command::Cleanup(args) => admin::cleanup(&*store::open(url).await?, args).await,
        Command::Queue(args) => queue::dispatch(url, args).await,
    }
}
