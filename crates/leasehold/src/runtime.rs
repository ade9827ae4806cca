//! The one tokio runtime of a process that calls this library from outside Rust (the C ABI, the
//! Python package): made on first use, shared by every binding in the process, and refused in a
//! child forked after it started.
//!
//! A forked child has the runtime's memory but none of its threads: a call there would wait
//! forever for a thread that does not exist. [`shared`] answers [`RuntimeError::Forked`] instead,
//! and [`is_forked`] tells a binding not to touch what the parent left (a lease must not be
//! released from the child's copy while the parent works under it).
//!
//! ```
//! let rt = leasehold::runtime::shared()?;
//! assert_eq!(rt.block_on(async { 1 + 1 }), 2);
//! assert!(!leasehold::runtime::is_forked());
//! # Ok::<(), leasehold::runtime::RuntimeError>(())
//! ```

use std::sync::OnceLock;
use std::time::{Duration, Instant};

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The process that first asked for the runtime.
static STARTED_IN: OnceLock<u32> = OnceLock::new();

/// Why the shared runtime cannot be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// This process is a child forked after the runtime started in `started`: it has the
    /// runtime's memory and none of its threads.
    #[error(
        "leasehold started its runtime in process {started}; process {current} is a fork of it \
         and cannot use it (its threads did not survive the fork)"
    )]
    Forked {
        /// The process that started the runtime.
        started: u32,
        /// This process.
        current: u32,
    },
    /// The operating system refused the runtime's threads or its I/O driver.
    #[error("cannot start the runtime: {0}")]
    Start(#[source] std::io::Error),
}

/// Refuses a call in a child forked after the runtime started (the first call here names this
/// process as the one that starts it).
///
/// # Errors
/// [`RuntimeError::Forked`] in such a child.
pub fn check_fork() -> Result<(), RuntimeError> {
    let current = std::process::id();
    let started = *STARTED_IN.get_or_init(|| current);
    if started == current {
        Ok(())
    } else {
        Err(RuntimeError::Forked { started, current })
    }
}

/// Whether this process is a child forked after the runtime started in another process.
pub fn is_forked() -> bool {
    STARTED_IN
        .get()
        .is_some_and(|&started| started != std::process::id())
}

/// The process's runtime, made on first use: multi-threaded, every driver enabled, its threads
/// named `leasehold`.
///
/// # Errors
/// [`RuntimeError::Forked`] in a child forked after it started; [`RuntimeError::Start`] when it
/// cannot be made.
pub fn shared() -> Result<&'static tokio::runtime::Runtime, RuntimeError> {
    check_fork()?;
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("leasehold")
        .build()
        .map_err(RuntimeError::Start)?;
    // Another thread may have won the race: its runtime is kept, this one dropped.
    Ok(RUNTIME.get_or_init(|| built))
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: the clock [`Instant`] reads on Linux, and the one
/// of C's `clock_gettime(CLOCK_MONOTONIC)` and Python's `time.monotonic()`.
pub fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes a timespec we own; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let sub = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(sub)
}

/// `instant` on `CLOCK_MONOTONIC`, in nanoseconds (see [`monotonic_now_ns`]).
///
/// ```
/// use std::time::{Duration, Instant};
/// let later = Instant::now() + Duration::from_secs(5);
/// let ns = leasehold::runtime::monotonic_ns(later);
/// let now = leasehold::runtime::monotonic_now_ns();
/// assert!(ns > now && ns - now <= 5_000_000_000);
/// ```
pub fn monotonic_ns(instant: Instant) -> u64 {
    let now = Instant::now();
    let now_ns = monotonic_now_ns();
    if instant >= now {
        now_ns.saturating_add(nanos(instant - now))
    } else {
        now_ns.saturating_sub(nanos(now - instant))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
