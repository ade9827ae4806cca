//! What every leasehold process sets up first: logging to stderr, and its async runtime (for the
//! commands, and for the `__supervise` task supervisor).

use crate::exit;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The log filter when `LEASEHOLD_LOG` is not set: leasehold's own warnings only. A dependency's
/// retries and internal errors (a credential provider trying again, a connection pool's
/// reconnects) stay behind `LEASEHOLD_LOG=debug`: what they lead to reaches the user as
/// leasehold's own one-line error. The library's "lease lost" warning is left out too: `run`
/// reports a loss itself, on one line.
const DEFAULT_LOG: &str =
    "off,leasehold=warn,leasehold_cli=warn,leasehold_servers=warn,leasehold::guard=error";

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
        // A closed stderr (`leasehold … 2>&1 >/dev/null | head -1`) loses the message: the
        // subscriber's own report of the failed write would panic on the same closed pipe.
        .log_internal_errors(false)
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
