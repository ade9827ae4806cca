//! The one tokio runtime of the process, and running the library's futures to their end from a
//! caller's thread.

use crate::boundary;
use crate::status::{lh_error, lh_status, Failure};
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The process that started the runtime. A child forked after that has the runtime's memory but
/// none of its threads: a call there would wait forever, so it is refused instead.
static STARTED_IN: OnceLock<u32> = OnceLock::new();

/// The runtime, made on first use: multi-threaded, its threads named `leasehold`.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, Failure> {
    let me = std::process::id();
    let started = *STARTED_IN.get_or_init(|| me);
    if started != me {
        return Err(Failure::new(
            lh_status::LH_FORKED,
            format!(
                "leasehold started its runtime in process {started}; process {me} is a fork of \
                 it and cannot use it (its threads did not survive the fork): use leasehold in a \
                 child only if the parent had not used it yet, or exec a new program"
            ),
        ));
    }
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let built = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("leasehold")
        .build()
        .map_err(|e| Failure::internal(format!("cannot start the runtime: {e}")))?;
    // Another thread may have won the race: its runtime is kept, this one dropped.
    Ok(RUNTIME.get_or_init(|| built))
}

/// Runs `fut` to its end on the calling thread (the runtime's threads drive its I/O and timers).
/// A caller already on a tokio runtime's thread (Rust code calling this library) cannot block
/// there: `fut` then runs on a thread of its own, which this one joins.
pub(crate) fn block<F>(fut: F) -> Result<F::Output, Failure>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(rt.block_on(fut));
    }
    std::thread::scope(|s| s.spawn(|| rt.block_on(fut)).join())
        .map_err(|_| Failure::internal("the call's thread panicked"))
}

/// `instant` on `CLOCK_MONOTONIC`, in nanoseconds (the clock `std::time::Instant` reads on
/// Linux, and `clock_gettime(CLOCK_MONOTONIC)` in C).
pub(crate) fn monotonic_ns(instant: Instant) -> u64 {
    let now = Instant::now();
    let now_ns = clock_monotonic_ns();
    if instant >= now {
        now_ns.saturating_add(nanos(instant - now))
    } else {
        now_ns.saturating_sub(nanos(now - instant))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn clock_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let sub = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(sub)
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: the scale of `lh_lease_valid_until_ns` and
/// `lh_lease_stop_by_ns`.
#[no_mangle]
pub extern "C" fn lh_monotonic_now_ns() -> u64 {
    boundary::value(0, clock_monotonic_ns)
}

/// Waits up to `timeout_ms` for this library's background work to finish: the releases of leases
/// freed without `lh_lease_release`, the withdrawal of waits given up. Call it before the process
/// exits, or those leases stay held until their TTL. `*left` (if not NULL) gets how many tasks
/// were still running at the limit.
///
/// # Safety
/// `left` is NULL or writable; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_settle(
    timeout_ms: u64,
    left: *mut u64,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        let limit = Duration::from_millis(timeout_ms);
        let n = block(leasehold_core::settle(limit))?;
        // SAFETY: the caller passes NULL or a writable u64.
        if let Some(left) = unsafe { left.as_mut() } {
            *left = u64::try_from(n).unwrap_or(u64::MAX);
        }
        Ok(lh_status::LH_OK)
    })
}
