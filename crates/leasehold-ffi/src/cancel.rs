//! `lh_cancel`: ends blocking calls from another thread.

use crate::boundary;
use crate::status::{lh_error, lh_status, Failure};
use std::future::Future;
use tokio::sync::watch;

/// A cancel handle: once fired (from any thread, any number of times), every blocking call
/// given it returns `LH_CANCELLED`, those running and those started later. Made by
/// `lh_cancel_new`, freed by `lh_cancel_free` once no call that was given it is running.
/// Thread-safe.
#[derive(Debug)]
pub struct lh_cancel {
    fired: watch::Sender<bool>,
}

impl lh_cancel {
    /// Completes once fired.
    async fn fired(&self) {
        let mut rx = self.fired.subscribe();
        // The sender is `self`, borrowed for as long as this waits: it cannot close.
        let _ = rx.wait_for(|fired| *fired).await;
    }
}

/// `fut`, or `Err(())` as soon as `cancel` (if any) is fired, `fut` then dropped. A cancel
/// fired before the call wins over a future that would complete at once.
pub(crate) async fn or_cancelled<F: Future>(
    cancel: Option<&lh_cancel>,
    fut: F,
) -> Result<F::Output, ()> {
    let Some(cancel) = cancel else {
        return Ok(fut.await);
    };
    tokio::select! {
        biased;
        () = cancel.fired() => Err(()),
        out = fut => Ok(out),
    }
}

/// Makes a cancel handle, not fired, in `*out`. The caller owns it: free it with
/// `lh_cancel_free`.
///
/// # Safety
/// `out` is writable; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lh_cancel_new(
    out: *mut *mut lh_cancel,
    err: *mut *mut lh_error,
) -> lh_status {
    boundary::call(err, || {
        // SAFETY: the caller's promise.
        let out = unsafe { boundary::out(out, "out") }?;
        *out = Box::into_raw(Box::new(lh_cancel {
            fired: watch::channel(false).0,
        }));
        Ok(lh_status::LH_OK)
    })
}

/// Fires `cancel`: the blocking calls given it return `LH_CANCELLED` (an acquisition once it has
/// undone what it started). Safe from any thread, also while those calls run; firing again does
/// nothing more. NULL is ignored.
///
/// # Safety
/// `cancel` is NULL or a live cancel handle.
#[no_mangle]
pub unsafe extern "C" fn lh_cancel_fire(cancel: *const lh_cancel) {
    boundary::value((), || {
        // SAFETY: the caller's promise.
        if let Some(c) = unsafe { cancel.as_ref() } {
            c.fired.send_replace(true);
        }
    })
}

/// Whether `cancel` was fired (false for NULL).
///
/// # Safety
/// `cancel` is NULL or a live cancel handle.
#[no_mangle]
pub unsafe extern "C" fn lh_cancel_is_fired(cancel: *const lh_cancel) -> bool {
    boundary::value(false, || {
        // SAFETY: the caller's promise.
        unsafe { cancel.as_ref() }.is_some_and(|c| *c.fired.borrow())
    })
}

/// Frees a cancel handle. NULL is ignored.
///
/// # Safety
/// `cancel` is NULL or a cancel handle not yet freed, that no running call was given.
#[no_mangle]
pub unsafe extern "C" fn lh_cancel_free(cancel: *mut lh_cancel) {
    // SAFETY: the caller's promise.
    boundary::value((), || unsafe { boundary::free(cancel) })
}

/// The cancel handle an entry point was given, or `None` for NULL.
///
/// # Safety
/// `cancel` is NULL or a live cancel handle for `'a`.
pub(crate) unsafe fn given<'a>(cancel: *const lh_cancel) -> Option<&'a lh_cancel> {
    // SAFETY: the caller's promise.
    unsafe { boundary::optional(cancel) }
}

/// `LH_CANCELLED` for `what`.
pub(crate) fn cancelled(what: &str) -> Failure {
    Failure::cancelled(what)
}
