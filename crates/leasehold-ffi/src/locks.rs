//! `lh_locks`: one client of one store; connecting, acquiring locks, semaphore permits and
//! read-write permits, and the store-level calls (`inspect`, `force_release`).

use crate::boundary;
use crate::cancel::{self, lh_cancel, or_cancelled};
use crate::lease::lh_lease;
use crate::options::{lh_connect_options, lh_lock_options};
use crate::runtime;
use crate::status::{c_string, lh_error, lh_status, owned_string, Failure};
use leasehold_core::{HolderId, Inspection, Key, LeaseRecord, LockBuilder, Locks};
use std::ffi::{c_char, CString};
use std::time::Duration;

/// How long a cancelled acquisition waits for the library to undo what it started (withdraw a
/// waiter registration, release a grant that was in flight), as the Python binding does.
const UNDO_LIMIT: Duration = Duration::from_secs(5);

/// A read permit of a read-write lock: shared with other readers, not with a writer.
pub const LH_RW_READ: u32 = 0;
/// The write permit of a read-write lock: alone on the key.
pub const LH_RW_WRITE: u32 = 1;

/// One client of one store, with one holder identity. Made by `lh_locks_connect`, freed by
/// `lh_locks_free`. Thread-safe: any number of threads may use one `lh_locks` at once. Leases
/// taken through it stay usable after it is freed.
#[derive(Debug)]
pub struct lh_locks {
    inner: Locks,
    holder: CString,
    store: CString,
}

/// Opens the store `url` names (every URL the `leasehold` command takes: `redis://`,
/// `postgres://`, `etcd://`, `file://`, `memory://` …) as one client, in `*out`. Blocks while
/// the store is opened; `cancel` (may be NULL) ends the wait with `LH_CANCELLED`. `opts` may be
/// NULL (every default). The caller owns `*out`: free it with `lh_locks_free`.
///
/// Errors: `LH_INVALID_URL`, `LH_FEATURE_NOT_ENABLED`, the store's own (`LH_IO` for a file
/// store directory that cannot be made, …).
///
/// # Safety
/// `url` is a NUL-terminated string; `opts` and `cancel` NULL or live handles; `out` writable;
/// `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_locks_connect(
    url: *const c_char,
    opts: *const lh_connect_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_locks,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promises, for each pointer.
        let (out, url, opts, cancel) = unsafe {
            (
                boundary::out(out, "out")?,
                boundary::text(url, "url")?,
                boundary::optional(opts).cloned().unwrap_or_default(),
                cancel::given(cancel),
            )
        };
        let opened = runtime::block(or_cancelled(cancel, leasehold_core::connect(url)))?
            .map_err(|()| cancel::cancelled("connecting"))??;
        let mut locks = match opts.holder {
            Some(h) => opened.with_holder(HolderId::new(h)),
            None => opened,
        };
        if let Some(on) = opts.local_layer {
            locks = locks.with_local_layer(on);
        }
        let made = lh_locks {
            holder: c_string(locks.holder().to_string()),
            store: c_string(locks.store().describe()),
            inner: locks,
        };
        *out = Box::into_raw(Box::new(made));
        Ok(lh_status::LH_OK)
    })
}

/// Frees a client. Leases taken through it are not released: they stay usable. NULL is
/// ignored.
///
/// # Safety
/// `locks` is NULL or a client not yet freed, that no running call uses.
#[no_mangle]
pub unsafe extern "C" fn lh_locks_free(locks: *mut lh_locks) {
    boundary::value((), || {
        // Dropping may end tasks of the store (connections): inside the runtime when there is one.
        let _in = runtime::runtime().ok().map(|rt| rt.enter());
        // SAFETY: the caller's promise.
        unsafe { boundary::free(locks) }
    })
}

/// The client's holder identity. Owned by `locks`: valid until `lh_locks_free(locks)`; "" for
/// NULL.
///
/// # Safety
/// `locks` is NULL or a live client.
#[no_mangle]
pub unsafe extern "C" fn lh_locks_holder(locks: *const lh_locks) -> *const c_char {
    boundary::value(c"".as_ptr(), || {
        // SAFETY: the caller's promise.
        unsafe { locks.as_ref() }.map_or(c"".as_ptr(), |l| l.holder.as_ptr())
    })
}

/// The store, described without credentials (`redis://127.0.0.1:6379/0`). Owned by `locks`:
/// valid until `lh_locks_free(locks)`; "" for NULL.
///
/// # Safety
/// `locks` is NULL or a live client.
#[no_mangle]
pub unsafe extern "C" fn lh_locks_store(locks: *const lh_locks) -> *const c_char {
    boundary::value(c"".as_ptr(), || {
        // SAFETY: the caller's promise.
        unsafe { locks.as_ref() }.map_or(c"".as_ptr(), |l| l.store.as_ptr())
    })
}

/// What is acquired.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Lock,
    Semaphore(u32),
    ReadWrite(u32),
}

/// Whether the acquisition waits.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Waits {
    Yes,
    No,
}

/// The pointers every acquisition takes.
struct Call {
    locks: *const lh_locks,
    key: *const c_char,
    opts: *const lh_lock_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_lease,
    err: *mut *mut lh_error,
}

/// Runs one acquisition for an entry point.
///
/// # Safety
/// The pointers of `c` as the entry points document them.
unsafe fn acquire(c: Call, kind: Kind, waits: Waits) -> lh_status {
    boundary::call(c.err, || {
        // SAFETY: the caller's promises, for each pointer.
        let (out, locks, key, opts, cancel) = unsafe {
            (
                boundary::out(c.out, "out")?,
                boundary::handle(c.locks, "locks")?,
                boundary::text(c.key, "key")?,
                boundary::optional(c.opts),
                cancel::given(c.cancel),
            )
        };
        let builder: LockBuilder = match kind {
            Kind::Lock => locks.inner.lock(key)?,
            Kind::Semaphore(n) => locks.inner.semaphore(key, n)?,
            Kind::ReadWrite(LH_RW_READ) => locks.inner.read_write(key)?.read(),
            Kind::ReadWrite(LH_RW_WRITE) => locks.inner.read_write(key)?.write(),
            Kind::ReadWrite(other) => {
                return Err(Failure::argument(format!(
                    "mode {other} is neither LH_RW_READ (0) nor LH_RW_WRITE (1)"
                )))
            }
        };
        let builder = match opts {
            Some(o) => o.apply(builder),
            None => builder,
        };
        let got = runtime::block(async move {
            let attempt = async move {
                match waits {
                    Waits::Yes => builder.acquire().await.map(Some),
                    Waits::No => builder.try_acquire().await,
                }
            };
            match or_cancelled(cancel, attempt).await {
                Ok(got) => got.map_err(Failure::from),
                Err(()) => {
                    // The attempt was dropped: what it started is undone in the background.
                    leasehold_core::settle(UNDO_LIMIT).await;
                    Err(cancel::cancelled("the acquisition").with_key(key))
                }
            }
        })??;
        match got {
            Some(guard) => {
                *out = Box::into_raw(Box::new(lh_lease::new(guard)));
                Ok(lh_status::LH_OK)
            }
            None => Ok(lh_status::LH_HELD),
        }
    })
}

/// Takes the lock `key`, waiting for it (up to the wait limit of `opts`; by default without a
/// limit), in `*out`. Waiters wake on the store's change notification where it has one. While
/// waiting the caller is registered as waiter (unless `opts` says not to): the holder's
/// handoff-requested event fires and, once freed, the lease is reserved for this waiter.
///
/// Firing `cancel` (may be NULL) from another thread ends the wait with `LH_CANCELLED` once the
/// waiter's place is withdrawn and a grant that was in flight released: nothing is left held or
/// queued. `opts` may be NULL (every default). The caller owns `*out`: release it with
/// `lh_lease_release` and free it with `lh_lease_free`.
///
/// Errors: `LH_TIMEOUT` (with the holder and the time waited), `LH_INVALID_KEY`,
/// `LH_INVALID_OPTION`, `LH_CANCELLED`, a store error that cannot heal (retryable ones are
/// retried while waiting).
///
/// # Safety
/// `locks` is a live client; `key` a NUL-terminated string; `opts` and `cancel` NULL or live
/// handles; `out` writable; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_acquire(
    locks: *const lh_locks,
    key: *const c_char,
    opts: *const lh_lock_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_lease,
    err: *mut *mut lh_error,
) -> lh_status {
    let c = Call {
        locks,
        key,
        opts,
        cancel,
        out,
        err,
    };
    // SAFETY: the caller's promises.
    unsafe { acquire(c, Kind::Lock, Waits::Yes) }
}

/// Takes the lock `key` if it is free, without waiting: `LH_OK` with the lease in `*out`, or
/// `LH_HELD` with `*out` NULL when another holder (or another task of this client) has it.
/// Otherwise as `lh_lock_acquire`.
///
/// # Safety
/// As `lh_lock_acquire`.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_try_acquire(
    locks: *const lh_locks,
    key: *const c_char,
    opts: *const lh_lock_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_lease,
    err: *mut *mut lh_error,
) -> lh_status {
    let c = Call {
        locks,
        key,
        opts,
        cancel,
        out,
        err,
    };
    // SAFETY: the caller's promises.
    unsafe { acquire(c, Kind::Lock, Waits::No) }
}

/// Takes one permit of the semaphore `key` of `permits` permits (1 to 64): at most `permits`
/// holders at once, across processes and hosts, each with its own fence; waiters served in
/// arrival order. Held, renewed, released and watched like a lock's lease. As
/// `lh_lock_acquire`, and `LH_INVALID_OPTION` when `permits` is out of range or the key is
/// held as something else (a lock, another count); `LH_NOT_SUPPORTED` on a store without
/// permits.
///
/// # Safety
/// As `lh_lock_acquire`.
#[no_mangle]
pub unsafe extern "C" fn lh_semaphore_acquire(
    locks: *const lh_locks,
    key: *const c_char,
    permits: u32,
    opts: *const lh_lock_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_lease,
    err: *mut *mut lh_error,
) -> lh_status {
    let c = Call {
        locks,
        key,
        opts,
        cancel,
        out,
        err,
    };
    // SAFETY: the caller's promises.
    unsafe { acquire(c, Kind::Semaphore(permits), Waits::Yes) }
}

/// The non-waiting form of `lh_semaphore_acquire`: `LH_HELD` when every permit is taken.
///
/// # Safety
/// As `lh_lock_acquire`.
#[no_mangle]
pub unsafe extern "C" fn lh_semaphore_try_acquire(
    locks: *const lh_locks,
    key: *const c_char,
    permits: u32,
    opts: *const lh_lock_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_lease,
    err: *mut *mut lh_error,
) -> lh_status {
    let c = Call {
        locks,
        key,
        opts,
        cancel,
        out,
        err,
    };
    // SAFETY: the caller's promises.
    unsafe { acquire(c, Kind::Semaphore(permits), Waits::No) }
}

/// Takes a permit of the read-write lock `key`: `mode` `LH_RW_READ` (shared with other readers,
/// not granted while a writer waits ahead) or `LH_RW_WRITE` (alone). Fences rise across reads
/// and writes. As `lh_semaphore_acquire`; `LH_INVALID_ARGUMENT` for another mode.
///
/// # Safety
/// As `lh_lock_acquire`.
#[no_mangle]
pub unsafe extern "C" fn lh_rwlock_acquire(
    locks: *const lh_locks,
    key: *const c_char,
    mode: u32,
    opts: *const lh_lock_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_lease,
    err: *mut *mut lh_error,
) -> lh_status {
    let c = Call {
        locks,
        key,
        opts,
        cancel,
        out,
        err,
    };
    // SAFETY: the caller's promises.
    unsafe { acquire(c, Kind::ReadWrite(mode), Waits::Yes) }
}

/// The non-waiting form of `lh_rwlock_acquire`: `LH_HELD` when the permit cannot be had now.
///
/// # Safety
/// As `lh_lock_acquire`.
#[no_mangle]
pub unsafe extern "C" fn lh_rwlock_try_acquire(
    locks: *const lh_locks,
    key: *const c_char,
    mode: u32,
    opts: *const lh_lock_options,
    cancel: *const lh_cancel,
    out: *mut *mut lh_lease,
    err: *mut *mut lh_error,
) -> lh_status {
    let c = Call {
        locks,
        key,
        opts,
        cancel,
        out,
        err,
    };
    // SAFETY: the caller's promises.
    unsafe { acquire(c, Kind::ReadWrite(mode), Waits::No) }
}

/// A record as JSON text.
pub(crate) fn to_json(r: &LeaseRecord) -> Result<String, Failure> {
    serde_json::to_string(r).map_err(|e| Failure::internal(format!("record to JSON: {e}")))
}

/// Runs a store-level call on `key` whose answer is an optional record, for an entry point.
///
/// # Safety
/// As the entry points document their pointers.
unsafe fn record_call<F, Fut>(
    locks: *const lh_locks,
    key: *const c_char,
    cancel: *const lh_cancel,
    json: *mut *mut c_char,
    err: *mut *mut lh_error,
    what: &'static str,
    call: F,
) -> lh_status
where
    F: FnOnce(std::sync::Arc<dyn leasehold_core::LockStore>, Key) -> Fut,
    Fut: std::future::Future<Output = Result<Option<LeaseRecord>, Failure>> + Send,
{
    boundary::call(err, || {
        // SAFETY: the caller's promises, for each pointer.
        let (json, locks, key, cancel) = unsafe {
            (
                boundary::out(json, "json")?,
                boundary::handle(locks, "locks")?,
                boundary::text(key, "key")?,
                cancel::given(cancel),
            )
        };
        let key = Key::new(key)?;
        let store = locks.inner.store().clone();
        let answer = runtime::block(or_cancelled(cancel, call(store, key)))?
            .map_err(|()| cancel::cancelled(what))??;
        if let Some(record) = answer {
            *json = owned_string(to_json(&record)?);
        }
        Ok(lh_status::LH_OK)
    })
}

/// The record the store keeps for `key`, as the JSON text `leasehold inspect` shows, in
/// `*json`; `*json` is NULL when the store has no record. The caller owns `*json`: free it with
/// `lh_string_free`. `LH_CORRUPT` when the record cannot be understood.
///
/// # Safety
/// `locks` is a live client; `key` a NUL-terminated string; `cancel` NULL or a live handle;
/// `json` writable; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_locks_inspect(
    locks: *const lh_locks,
    key: *const c_char,
    cancel: *const lh_cancel,
    json: *mut *mut c_char,
    err: *mut *mut lh_error,
) -> lh_status {
    let call = |store: std::sync::Arc<dyn leasehold_core::LockStore>, key: Key| async move {
        match store.inspect(&key).await? {
            None => Ok(None),
            Some(Inspection::Record(r)) => Ok(Some(r)),
            Some(Inspection::Corrupt { name, detail }) => {
                Err(Failure::from(leasehold_core::Error::Corrupt {
                    key: name,
                    detail,
                }))
            }
        }
    };
    // SAFETY: the caller's promises.
    unsafe { record_call(locks, key, cancel, json, err, "inspecting", call) }
}

/// Frees `key` whoever holds it, as `leasehold release --force` does: the record it removed as
/// JSON text in `*json`, or NULL when the key was free. The holder's next renewal fails and its
/// lost event fires. The caller owns `*json`: free it with `lh_string_free`. A cancelled call
/// may or may not have freed the key.
///
/// # Safety
/// As `lh_locks_inspect`.
#[no_mangle]
pub unsafe extern "C" fn lh_locks_force_release(
    locks: *const lh_locks,
    key: *const c_char,
    cancel: *const lh_cancel,
    json: *mut *mut c_char,
    err: *mut *mut lh_error,
) -> lh_status {
    let call = |store: std::sync::Arc<dyn leasehold_core::LockStore>, key: Key| async move {
        Ok(store.force_release(&key).await?)
    };
    // SAFETY: the caller's promises.
    unsafe { record_call(locks, key, cancel, json, err, "force-releasing", call) }
}
