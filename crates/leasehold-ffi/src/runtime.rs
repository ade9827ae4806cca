//! The one tokio runtime of the process, and running the library's futures to their end from a
//! caller's thread.

use crate::boundary;
use crate::status::{lh_error, lh_status, Failure};
use leasehold_core::runtime::{self as shared, RuntimeError};
use std::future::Future;
use std::time::Duration;

/// The process's runtime ([`leasehold_core::runtime::shared`], the one the Python package uses
/// too), made on first use; refused in a child forked after it started.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, Failure> {
    shared::shared().map_err(|e| match e {
        RuntimeError::Forked { .. } => Failure::new(
            lh_status::LH_FORKED,
            format!(
                "{e}: use leasehold in a child only if the parent had not used it yet, or exec a \
                 new program"
            ),
        ),
        other => Failure::internal(other.to_string()),
    })
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

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: the scale of `lh_lease_valid_until_ns` and
/// `lh_lease_stop_by_ns`.
#[no_mangle]
pub extern "C" fn lh_monotonic_now_ns() -> u64 {
    boundary::value(0, shared::monotonic_now_ns)
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
