//! `lh_lease`: a held lease, its events (lost, must stop, handoff requested, released) and its
//! release.

use crate::boundary;
use crate::cancel::{self, lh_cancel, or_cancelled};
use crate::locks::to_json;
use crate::runtime;
use crate::status::{c_string, lh_error, lh_status, owned_string, Failure};
use futures_util::FutureExt;
use leasehold_core::{LeaseGuard, Released};
use std::ffi::{c_char, CString};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The lease was lost: expired, taken over, or force-released (the store said it is gone, or
/// renewals could not reach it before `valid_until`). Implies `LH_EVENT_MUST_STOP`.
pub const LH_EVENT_LOST: u32 = 1;
/// Whatever acts under the lease must start stopping: renewals have failed into the loss grace
/// (the lease is still valid until `lh_lease_valid_until_ns`), or the lease is lost. A renewal
/// that succeeds afterwards clears it.
pub const LH_EVENT_MUST_STOP: u32 = 2;
/// A waiter asked for the lease (seen at a renewal): checkpoint and release, and it goes to that
/// waiter. Never cleared.
pub const LH_EVENT_HANDOFF_REQUESTED: u32 = 4;
/// The lease was released through `lh_lease_release`. Reported by `lh_lease_wait_event`
/// whatever the mask, so that a wait ends with the lease.
pub const LH_EVENT_RELEASED: u32 = 8;

/// What `lh_lease_release` found.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum lh_release_outcome {
    /// The lease was ours and is free now (or handed to the next waiting task of this client).
    LH_RELEASE_DONE = 0,
    /// An earlier release already freed it: release is idempotent.
    LH_RELEASE_ALREADY = 1,
    /// The lease was no longer ours when released (the call returns `LH_LOST`).
    LH_RELEASE_LOST = 2,
}

/// A lease this process holds, renewed in the background until released. Made by the
/// acquisitions, freed by `lh_lease_free` (which releases it in the background if it was not
/// released). Thread-safe: any number of threads may read it, wait for its events and release it
/// at once; only `lh_lease_free` needs every other call on it to have returned.
#[derive(Debug)]
pub struct lh_lease {
    guard: Arc<LeaseGuard>,
    key: CString,
    holder: CString,
    token: CString,
    released: watch::Sender<bool>,
}

impl lh_lease {
    pub(crate) fn new(guard: LeaseGuard) -> Self {
        lh_lease {
            key: c_string(guard.key().as_str()),
            holder: c_string(guard.record().holder.clone().unwrap_or_default()),
            token: c_string(guard.token()),
            guard: Arc::new(guard),
            released: watch::channel(false).0,
        }
    }

    /// The events that hold now, of every kind. Inside the runtime (the lost check reads its
    /// clock).
    fn events(&self) -> u32 {
        let mut events = 0;
        if self.guard.lost().now_or_never().is_some() {
            events |= LH_EVENT_LOST | LH_EVENT_MUST_STOP;
        }
        if self.guard.is_stop_due() {
            events |= LH_EVENT_MUST_STOP;
        }
        if self.guard.is_handoff_requested() {
            events |= LH_EVENT_HANDOFF_REQUESTED;
        }
        if *self.released.borrow() {
            events |= LH_EVENT_RELEASED;
        }
        events
    }

    /// Completes when an event of `mask` (or the release) may have happened.
    async fn changed(&self, mask: u32) {
        let mut released = self.released.subscribe();
        let g = &self.guard;
        tokio::select! {
            _ = g.lost(), if mask & LH_EVENT_LOST != 0 => {}
            _ = g.must_stop(), if mask & LH_EVENT_MUST_STOP != 0 => {}
            _ = g.handoff_requested(), if mask & LH_EVENT_HANDOFF_REQUESTED != 0 => {}
            _ = released.wait_for(|r| *r) => {}
        }
    }

    /// The events of `mask` that hold, once one does (or the lease is released).
    async fn wait(&self, mask: u32) -> u32 {
        loop {
            let now = self.events() & (mask | LH_EVENT_RELEASED);
            if now != 0 {
                return now;
            }
            // A must-stop cleared by a renewal between the wake-up and the look: wait again.
            self.changed(mask).await;
        }
    }
}

/// Runs a getter on a lease, with `fallback` for NULL or a panic.
///
/// # Safety
/// `lease` is NULL or a live lease.
unsafe fn get<T>(lease: *const lh_lease, fallback: T, f: impl FnOnce(&lh_lease) -> T) -> T
where
    T: Copy,
{
    boundary::value(fallback, || {
        // SAFETY: the caller's promise.
        unsafe { lease.as_ref() }.map_or(fallback, f)
    })
}

/// The fence of this acquisition: strictly greater than every earlier fence of the key. Hand it
/// to the resource the lease guards, which refuses writes with a fence below the highest it has
/// seen. 0 for NULL.
///
/// # Safety
/// `lease` is NULL or a live lease.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_fence(lease: *const lh_lease) -> u64 {
    // SAFETY: the caller's promise.
    unsafe { get(lease, 0, |l| l.guard.fence()) }
}

/// The key. Owned by `lease`: valid until `lh_lease_free(lease)`; "" for NULL.
///
/// # Safety
/// `lease` is NULL or a live lease.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_key(lease: *const lh_lease) -> *const c_char {
    // SAFETY: the caller's promise.
    unsafe { get(lease, c"".as_ptr(), |l| l.key.as_ptr()) }
}

/// The holder identity the lease was taken with. Owned by `lease`: valid until
/// `lh_lease_free(lease)`; "" for NULL.
///
/// # Safety
/// `lease` is NULL or a live lease.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_holder(lease: *const lh_lease) -> *const c_char {
    // SAFETY: the caller's promise.
    unsafe { get(lease, c"".as_ptr(), |l| l.holder.as_ptr()) }
}

/// This acquisition's owner token (tells this lease from a later one of the same holder).
/// Owned by `lease`: valid until `lh_lease_free(lease)`; "" for NULL.
///
/// # Safety
/// `lease` is NULL or a live lease.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_token(lease: *const lh_lease) -> *const c_char {
    // SAFETY: the caller's promise.
    unsafe { get(lease, c"".as_ptr(), |l| l.token.as_ptr()) }
}

/// Until when the lease is surely ours, on `CLOCK_MONOTONIC` in nanoseconds (compare with
/// `lh_monotonic_now_ns`): when the last successful grant or renewal was sent, plus the TTL,
/// less the drift margin. Moves with each renewal; means nothing once lost or released. 0 for
/// NULL.
///
/// # Safety
/// `lease` is NULL or a live lease.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_valid_until_ns(lease: *const lh_lease) -> u64 {
    // SAFETY: the caller's promise.
    unsafe {
        get(lease, 0, |l| {
            leasehold_core::runtime::monotonic_ns(l.guard.valid_until().into_std())
        })
    }
}

/// The stop-by deadline on `CLOCK_MONOTONIC` in nanoseconds: `valid_until` less the loss grace.
/// Unless a renewal moves it, `LH_EVENT_MUST_STOP` fires then. 0 for NULL.
///
/// # Safety
/// `lease` is NULL or a live lease.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_stop_by_ns(lease: *const lh_lease) -> u64 {
    // SAFETY: the caller's promise.
    unsafe {
        get(lease, 0, |l| {
            leasehold_core::runtime::monotonic_ns(l.guard.stop_by().into_std())
        })
    }
}

/// Whether the lease is surely still ours: not lost, not released, before `valid_until`. Asks
/// no store: check it before each write the lease protects (and pass the fence along). False
/// for NULL.
///
/// # Safety
/// `lease` is NULL or a live lease.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_is_current(lease: *const lh_lease) -> bool {
    // SAFETY: the caller's promise.
    unsafe { get(lease, false, |l| l.guard.is_current()) }
}

/// Waits for an event of the lease, without asking the store: `mask` is a set of
/// `LH_EVENT_LOST`, `LH_EVENT_MUST_STOP` and `LH_EVENT_HANDOFF_REQUESTED`. Returns `LH_OK` with
/// `*events` the events of `mask` that hold (several may), plus `LH_EVENT_RELEASED` once the
/// lease was released (whatever the mask); `*events` is 0 when `timeout_ms` passed first.
/// `timeout_ms` < 0 waits without a limit, 0 only looks. Firing `cancel` (may be NULL) ends the
/// wait with `LH_CANCELLED`. Many threads may wait on one lease at once.
///
/// # Safety
/// `lease` is a live lease; `cancel` NULL or a live handle; `events` writable; `err` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_wait_event(
    lease: *const lh_lease,
    mask: u32,
    timeout_ms: i64,
    cancel: *const lh_cancel,
    events: *mut u32,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promises, for each pointer.
        let (events, lease, cancel) = unsafe {
            (
                events
                    .as_mut()
                    .ok_or_else(|| Failure::argument("events is NULL"))?,
                boundary::handle(lease, "lease")?,
                cancel::given(cancel),
            )
        };
        *events = 0;
        let limit = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let waited = runtime::block(or_cancelled(cancel, async {
            match limit {
                None => lease.wait(mask).await,
                Some(l) => tokio::time::timeout(l, lease.wait(mask)).await.unwrap_or(0),
            }
        }))?;
        *events = waited.map_err(|()| cancel::cancelled("waiting for an event"))?;
        Ok(lh_status::LH_OK)
    })
}

/// Why the lease was lost, in words, in `*reason`; NULL when it is not lost. The caller owns
/// `*reason`: free it with `lh_string_free`.
///
/// # Safety
/// `lease` is a live lease; `reason` writable; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_lost_reason(
    lease: *const lh_lease,
    reason: *mut *mut c_char,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promises.
        let (reason, lease) = unsafe {
            (
                boundary::out(reason, "reason")?,
                boundary::handle(lease, "lease")?,
            )
        };
        let lost = runtime::block(async { lease.guard.lost().now_or_never() })?;
        if let Some(why) = lost {
            *reason = owned_string(why.to_string());
        }
        Ok(lh_status::LH_OK)
    })
}

/// The identity of the waiter that asked for the lease, in `*waiter`; NULL when none has. The
/// caller owns `*waiter`: free it with `lh_string_free`.
///
/// # Safety
/// `lease` is a live lease; `waiter` writable; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_handoff_waiter(
    lease: *const lh_lease,
    waiter: *mut *mut c_char,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promises.
        let (waiter, lease) = unsafe {
            (
                boundary::out(waiter, "waiter")?,
                boundary::handle(lease, "lease")?,
            )
        };
        if let Some(who) = lease.guard.handoff_requested().now_or_never() {
            *waiter = owned_string(who);
        }
        Ok(lh_status::LH_OK)
    })
}

/// The lease's record as JSON text, as it was when the lease was granted (labels included), in
/// `*json`. The caller owns `*json`: free it with `lh_string_free`.
///
/// # Safety
/// `lease` is a live lease; `json` writable; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_record_json(
    lease: *const lh_lease,
    json: *mut *mut c_char,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promises.
        let (json, lease) = unsafe {
            (
                boundary::out(json, "json")?,
                boundary::handle(lease, "lease")?,
            )
        };
        *json = owned_string(to_json(lease.guard.record())?);
        Ok(lh_status::LH_OK)
    })
}

/// Releases the lease. Idempotent: `LH_OK` with `*outcome` (if not NULL) `LH_RELEASE_DONE`, then
/// `LH_RELEASE_ALREADY` on later calls; `LH_LOST` (`LH_RELEASE_LOST`) when the lease was no
/// longer ours. Waits of `lh_lease_wait_event` end with `LH_EVENT_RELEASED`. Firing `cancel`
/// (may be NULL) returns `LH_CANCELLED` at once and lets the release finish in the background.
/// The lease must still be freed with `lh_lease_free`.
///
/// # Safety
/// `lease` is a live lease; `cancel` NULL or a live handle; `outcome` NULL or writable; `err`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_release(
    lease: *const lh_lease,
    cancel: *const lh_cancel,
    outcome: *mut lh_release_outcome,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promises.
        let (lease, cancel) = unsafe { (boundary::handle(lease, "lease")?, cancel::given(cancel)) };
        let rt = runtime::runtime()?;
        let guard = lease.guard.clone();
        let task = rt.spawn(async move { guard.release().await });
        lease.released.send_replace(true);
        let answer = runtime::block(or_cancelled(cancel, task))?
            .map_err(|()| cancel::cancelled("the release"))?
            .map_err(|e| Failure::internal(format!("the release's task failed: {e}")))??;
        let (status, found) = match answer {
            Released::Released => (lh_status::LH_OK, lh_release_outcome::LH_RELEASE_DONE),
            Released::AlreadyReleased => (lh_status::LH_OK, lh_release_outcome::LH_RELEASE_ALREADY),
            Released::Lost(reason) => {
                // SAFETY: the caller passes NULL or a writable outcome.
                if let Some(o) = unsafe { outcome.as_mut() } {
                    *o = lh_release_outcome::LH_RELEASE_LOST;
                }
                return Err(Failure::new(
                    lh_status::LH_LOST,
                    format!(
                        "lease on {} lost before its release: {reason}",
                        lease.guard.key()
                    ),
                )
                .with_key(lease.guard.key().as_str()));
            }
        };
        // SAFETY: the caller passes NULL or a writable outcome.
        if let Some(o) = unsafe { outcome.as_mut() } {
            *o = found;
        }
        Ok(status)
    })
}

/// Frees a lease. One not released is released in the background (`lh_settle` waits for that
/// before the process exits; else it expires by its TTL). NULL is ignored.
///
/// # Safety
/// `lease` is NULL or a lease not yet freed, that no running call uses.
#[no_mangle]
pub unsafe extern "C" fn lh_lease_free(lease: *mut lh_lease) {
    boundary::value((), || {
        // The guard's drop releases on the current runtime: this library's.
        let _in = runtime::runtime().ok().map(|rt| rt.enter());
        // SAFETY: the caller's promise.
        unsafe { boundary::free(lease) }
    })
}
