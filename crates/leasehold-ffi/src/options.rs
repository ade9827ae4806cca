//! The option handles: `lh_connect_options` (one client) and `lh_lock_options` (one
//! acquisition). Setters only record values; the library checks them when it uses them.

use crate::boundary;
use crate::status::{lh_error, lh_status};
use leasehold_core::{Backoff, LockBuilder, Wait};
use std::collections::BTreeMap;
use std::ffi::c_char;
use std::time::Duration;

/// Options of `lh_locks_connect`. Made by `lh_connect_options_new`, freed by
/// `lh_connect_options_free`; a setter must not run while another call uses the same handle.
#[derive(Debug, Default, Clone)]
pub struct lh_connect_options {
    pub(crate) holder: Option<String>,
    pub(crate) local_layer: Option<bool>,
}

/// Options of one acquisition (`lh_lock_acquire` and the others). Made by
/// `lh_lock_options_new`, freed by `lh_lock_options_free`. Unset options keep the library's
/// defaults (TTL 30 s, wait without limit, renewal every TTL/3, waiter registration on). One
/// handle may be given to many acquisitions at once, from many threads, as long as no setter
/// runs meanwhile.
#[derive(Debug, Default, Clone)]
pub struct lh_lock_options {
    ttl: Option<Duration>,
    wait: Option<Wait>,
    renew_every: Option<Duration>,
    loss_grace: Option<Duration>,
    waiter_ttl: Option<Duration>,
    register_waiter: Option<bool>,
    auto_renew: Option<bool>,
    backoff: Option<Backoff>,
    labels: BTreeMap<String, String>,
}

impl lh_lock_options {
    /// `b` with these options applied over its defaults.
    pub(crate) fn apply(&self, mut b: LockBuilder) -> LockBuilder {
        if let Some(ttl) = self.ttl {
            b = b.ttl(ttl);
        }
        if let Some(wait) = self.wait {
            b = b.wait_policy(wait);
        }
        if let Some(p) = self.renew_every {
            b = b.renew_every(p);
        }
        if let Some(g) = self.loss_grace {
            b = b.loss_grace(g);
        }
        if let Some(w) = self.waiter_ttl {
            b = b.waiter_ttl(w);
        }
        if let Some(on) = self.register_waiter {
            b = b.register_waiter(on);
        }
        if let Some(on) = self.auto_renew {
            b = b.auto_renew(on);
        }
        if let Some(backoff) = self.backoff {
            b = b.backoff(backoff);
        }
        for (k, v) in &self.labels {
            b = b.label(k.clone(), v.clone());
        }
        b
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Makes connect options with every default in `*out` (holder from the environment:
/// `POD_NAMESPACE/POD_NAME`, else host-pid-random; local layer on). Free with
/// `lh_connect_options_free`.
///
/// # Safety
/// `out` is writable; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_connect_options_new(
    out: *mut *mut lh_connect_options,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promise.
        let out = unsafe { boundary::out(out, "out") }?;
        *out = Box::into_raw(Box::default());
        Ok(lh_status::LH_OK)
    })
}

/// Frees connect options. NULL is ignored.
///
/// # Safety
/// `opts` is NULL or connect options not yet freed and not in use by a running call.
#[no_mangle]
pub unsafe extern "C" fn lh_connect_options_free(opts: *mut lh_connect_options) {
    // SAFETY: the caller's promise.
    boundary::value((), || unsafe { boundary::free(opts) })
}

/// The holder identity written into every lease taken through the client and shown to
/// contenders (copied; the caller keeps `holder`).
///
/// # Safety
/// `opts` is live connect options; `holder` a NUL-terminated string; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_connect_options_set_holder(
    opts: *mut lh_connect_options,
    holder: *const c_char,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promise.
        let opts = unsafe { boundary::handle_mut(opts, "opts") }?;
        // SAFETY: the caller's promise.
        let holder = unsafe { boundary::text(holder, "holder") }?;
        opts.holder = Some(holder.to_owned());
        Ok(lh_status::LH_OK)
    })
}

/// Turns the in-process layer on (default) or off. With it on, acquisitions of one key through
/// one `lh_locks` queue in the process first come, first served, and a released lease can pass
/// to the next of them without a store call; with it off each is a contender in the store like
/// another process.
///
/// # Safety
/// `opts` is live connect options; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_connect_options_set_local_layer(
    opts: *mut lh_connect_options,
    on: bool,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promise.
        unsafe { boundary::handle_mut(opts, "opts") }?.local_layer = Some(on);
        Ok(lh_status::LH_OK)
    })
}

/// Makes lock options with every default in `*out`. Free with `lh_lock_options_free`.
///
/// # Safety
/// `out` is writable; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_new(
    out: *mut *mut lh_lock_options,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promise.
        let out = unsafe { boundary::out(out, "out") }?;
        *out = Box::into_raw(Box::default());
        Ok(lh_status::LH_OK)
    })
}

/// Frees lock options. NULL is ignored.
///
/// # Safety
/// `opts` is NULL or lock options not yet freed and not in use by a running call.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_free(opts: *mut lh_lock_options) {
    // SAFETY: the caller's promise.
    boundary::value((), || unsafe { boundary::free(opts) })
}

/// Runs a setter of lock options.
///
/// # Safety
/// `opts` is NULL or live lock options nothing else uses; `err` NULL or writable.
unsafe fn set(
    opts: *mut lh_lock_options,
    err: *mut *mut lh_error,
    f: impl FnOnce(&mut lh_lock_options),
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promise.
        f(unsafe { boundary::handle_mut(opts, "opts") }?);
        Ok(lh_status::LH_OK)
    })
}

/// Time to live in milliseconds (default 30 000; from 10 ms to one year, else the acquisition
/// fails with `LH_INVALID_OPTION`). A holder that stops renewing loses the lease after it.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_ttl_ms(
    opts: *mut lh_lock_options,
    ttl_ms: u64,
    err: *mut *mut lh_error,
) -> lh_status {
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.ttl = Some(ms(ttl_ms))) }
}

/// How long a blocking acquire waits for a held key before failing with `LH_TIMEOUT` (naming
/// the holder). 0: do not wait (a held key fails at once with `LH_TIMEOUT`). Try-acquires never
/// wait, whatever this says.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_wait_ms(
    opts: *mut lh_lock_options,
    wait_ms: u64,
    err: *mut *mut lh_error,
) -> lh_status {
    let wait = if wait_ms == 0 {
        Wait::No
    } else {
        Wait::For(ms(wait_ms))
    };
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.wait = Some(wait)) }
}

/// Waits without a limit (the default): only the lease, an error that cannot heal, or the
/// call's `lh_cancel` ends a blocking acquire.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_wait_forever(
    opts: *mut lh_lock_options,
    err: *mut *mut lh_error,
) -> lh_status {
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.wait = Some(Wait::Forever)) }
}

/// Renewal period in milliseconds (default TTL/3); also how often the holder learns that a
/// waiter asked for the lease. It must be above zero and leave the drift margin before the TTL.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_renew_every_ms(
    opts: *mut lh_lock_options,
    period_ms: u64,
    err: *mut *mut lh_error,
) -> lh_status {
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.renew_every = Some(ms(period_ms))) }
}

/// The loss grace in milliseconds: how long before the lease could expire the must-stop event
/// fires when renewals have not succeeded (default: min(TTL/3, (TTL − renewal period −
/// drift)/2)). Needs renewal period + loss grace + drift < TTL.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_loss_grace_ms(
    opts: *mut lh_lock_options,
    grace_ms: u64,
    err: *mut *mut lh_error,
) -> lh_status {
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.loss_grace = Some(ms(grace_ms))) }
}

/// The waiter registration's lifetime in milliseconds (default min(TTL, 5 s), at least 10 ms).
/// A waiter that went away without withdrawing stops reserving the lease once it lapses.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_waiter_ttl_ms(
    opts: *mut lh_lock_options,
    ttl_ms: u64,
    err: *mut *mut lh_error,
) -> lh_status {
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.waiter_ttl = Some(ms(ttl_ms))) }
}

/// Whether a waiting acquire registers as waiter (default true): the holder's
/// handoff-requested event fires and, once freed, the lease is reserved for this waiter.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_register_waiter(
    opts: *mut lh_lock_options,
    on: bool,
    err: *mut *mut lh_error,
) -> lh_status {
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.register_waiter = Some(on)) }
}

/// Whether the lease renews itself (default true). Without renewal it lives one TTL, and the
/// lost event fires once the TTL less the drift margin has passed.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_auto_renew(
    opts: *mut lh_lock_options,
    on: bool,
    err: *mut *mut lh_error,
) -> lh_status {
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.auto_renew = Some(on)) }
}

/// Backoff between attempts while waiting and between retries of a failed renewal, in
/// milliseconds (default 5 doubling to 500, jittered). Needs 0 < initial ≤ max.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_set_backoff_ms(
    opts: *mut lh_lock_options,
    initial_ms: u64,
    max_ms: u64,
    err: *mut *mut lh_error,
) -> lh_status {
    let backoff = Backoff {
        initial: ms(initial_ms),
        max: ms(max_ms),
    };
    // SAFETY: the caller's promise.
    unsafe { set(opts, err, |o| o.backoff = Some(backoff)) }
}

/// Adds a label stored with the lease (task id, purpose …), copied; a second label of the same
/// name replaces the first.
///
/// # Safety
/// `opts` is live lock options nothing else uses; `name` and `value` NUL-terminated strings;
/// `err` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_lock_options_add_label(
    opts: *mut lh_lock_options,
    name: *const c_char,
    value: *const c_char,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promise.
        let opts = unsafe { boundary::handle_mut(opts, "opts") }?;
        // SAFETY: the caller's promise.
        let name = unsafe { boundary::text(name, "name") }?;
        // SAFETY: the caller's promise.
        let value = unsafe { boundary::text(value, "value") }?;
        opts.labels.insert(name.to_owned(), value.to_owned());
        Ok(lh_status::LH_OK)
    })
}
