//! Store calls left to finish in the background: the release of a guard dropped without
//! `release()`, the withdrawal of a waiter registration whose `acquire` was cancelled, the release
//! of a lease granted after its caller's wait limit. [`settle`] waits for them before a process
//! exits, so that what it held or reserved is freed at once, not by expiry.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The background calls not known to have finished.
static PENDING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Runs `call` on `handle`'s runtime and keeps track of it for [`settle`].
pub(crate) fn spawn(
    handle: &tokio::runtime::Handle,
    call: impl Future<Output = ()> + Send + 'static,
) {
    let task = handle.spawn(call);
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    // Finished ones are dropped whenever the list doubles: 10,000 guards dropped at once cost a
    // few passes, not one per guard.
    if pending.len() >= 64 && pending.len().is_power_of_two() {
        pending.retain(|t| !t.is_finished());
    }
    pending.push(task);
}

/// The runtime a value that cleans up on drop was made under, for that clean-up: a value
/// dropped outside any runtime (on a plain thread, by a foreign language's garbage collector, or
/// after a blocking call was interrupted) still has its clean-up run.
pub(crate) fn here() -> Option<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current().ok()
}

/// [`spawn`] on the current runtime, or outside one on `made_under` (the runtime the value
/// cleaning up was made under, from [`here`]); nothing when there is neither. A runtime shut
/// down meanwhile drops the call unrun (what was held then expires by itself).
pub(crate) fn spawn_on(
    made_under: Option<&tokio::runtime::Handle>,
    call: impl Future<Output = ()> + Send + 'static,
) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => spawn(&handle, call),
        Err(_) => {
            if let Some(handle) = made_under {
                spawn(handle, call);
            }
        }
    }
}

/// Waits, at most `limit`, for the store calls that dropped guards and cancelled or timed-out
/// acquisitions left running in the background (releases, waiter withdrawals); returns how many
/// did not finish in time (they go on if the runtime does; their leases and registrations expire
/// by themselves otherwise).
///
/// Call it before a process or runtime shuts down: a runtime that is shut down drops such calls
/// unfinished, so a lease a dropped guard held would stay taken until its TTL ran out, and a
/// waiter registration would keep the next holder waiting until it lapsed.
///
/// ```
/// # async fn demo() -> leasehold::Result<()> {
/// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
/// let guard = locks.lock("job")?.try_acquire().await?;
/// drop(guard); // released in the background
/// assert_eq!(leasehold::settle(std::time::Duration::from_secs(1)).await, 0);
/// # Ok(()) }
/// ```
pub async fn settle(limit: Duration) -> usize {
    let tasks: Vec<JoinHandle<()>> =
        std::mem::take(&mut *PENDING.lock().unwrap_or_else(|e| e.into_inner()));
    let deadline = tokio::time::Instant::now() + limit;
    let mut left = 0;
    for mut task in tasks {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            left += 1;
            // Still tracked: a later `settle` waits for it again.
            PENDING.lock().unwrap_or_else(|e| e.into_inner()).push(task);
        }
    }
    left
}
