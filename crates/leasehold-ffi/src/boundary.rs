//! The panic boundary every entry point runs inside, and the checks of the pointers a caller
//! passes.

use crate::status::{lh_error, lh_status, Failure};
use std::any::Any;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs an entry point's body: its status, or the status of its failure with the failure as an
/// `lh_error` written to `*err` (when `err` is not NULL). `*err` is NULL on entry and after
/// success. A panic becomes `LH_PANIC`.
pub(crate) fn call(
    err: *mut *mut lh_error,
    body: impl FnOnce() -> Result<lh_status, Failure>,
) -> lh_status {
    if !err.is_null() {
        // SAFETY: the caller passes NULL or a writable `lh_error *`.
        unsafe { *err = std::ptr::null_mut() };
    }
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|p| Err(panicked(p)));
    match outcome {
        Ok(status) => status,
        Err(failure) => {
            let code = failure.code();
            if !err.is_null() {
                let made = catch_unwind(AssertUnwindSafe(|| {
                    Box::into_raw(Box::new(failure.into_error()))
                }));
                // SAFETY: as above.
                unsafe { *err = made.unwrap_or(std::ptr::null_mut()) };
            }
            code
        }
    }
}

/// Runs a getter's body: its value, or `fallback` if it panicked.
pub(crate) fn value<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// `LH_PANIC` saying what the panic said.
fn panicked(payload: Box<dyn Any + Send>) -> Failure {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    // The payload's own drop could panic: leave it.
    std::mem::forget(payload);
    Failure::new(
        lh_status::LH_PANIC,
        format!("leasehold panicked (a defect; please report it): {what}"),
    )
}

/// The UTF-8 string `p` points to.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that stays valid and unchanged for `'a`.
pub(crate) unsafe fn text<'a>(p: *const c_char, name: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::argument(format!("{name} is NULL")));
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| Failure::argument(format!("{name} is not UTF-8: {e}")))
}

/// The handle `p` points to.
///
/// # Safety
/// `p` is NULL or a live handle of type `T` for `'a`.
pub(crate) unsafe fn handle<'a, T>(p: *const T, name: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller's promise.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::argument(format!("{name} is NULL")))
}

/// The handle `p` points to, or `None` for NULL (an optional argument).
///
/// # Safety
/// `p` is NULL or a live handle of type `T` for `'a`.
pub(crate) unsafe fn optional<'a, T>(p: *const T) -> Option<&'a T> {
    // SAFETY: the caller's promise.
    unsafe { p.as_ref() }
}

/// The out-pointer `out`, its target set to NULL.
///
/// # Safety
/// `out` is NULL or writable for `'a`.
pub(crate) unsafe fn out<'a, T>(out: *mut *mut T, name: &str) -> Result<&'a mut *mut T, Failure> {
    // SAFETY: the caller's promise.
    let slot =
        unsafe { out.as_mut() }.ok_or_else(|| Failure::argument(format!("{name} is NULL")))?;
    *slot = std::ptr::null_mut();
    Ok(slot)
}

/// The mutable handle `p` points to.
///
/// # Safety
/// `p` is NULL or a live handle of type `T` that nothing else uses for `'a`.
pub(crate) unsafe fn handle_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: the caller's promise.
    unsafe { p.as_mut() }.ok_or_else(|| Failure::argument(format!("{name} is NULL")))
}

/// Frees a boxed handle made with `Box::into_raw`; NULL is ignored.
///
/// # Safety
/// `p` is NULL or a handle of type `T` made by this library and not yet freed.
pub(crate) unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: the caller's promise.
        drop(unsafe { Box::from_raw(p) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_lh_panic_with_an_error_saying_it() {
        let mut err: *mut lh_error = std::ptr::null_mut();
        let status = call(&mut err, || panic!("boom at the boundary"));
        assert_eq!(status, lh_status::LH_PANIC);
        assert!(!err.is_null());
        // SAFETY: just made by `call`.
        let message = unsafe { CStr::from_ptr(crate::status::lh_error_message(err)) };
        assert!(message.to_string_lossy().contains("boom at the boundary"));
        // SAFETY: made by `call`, freed once.
        unsafe { crate::status::lh_error_free(err) };
        assert_eq!(value(7, || panic!("in a getter")), 7);
    }

    #[test]
    fn success_leaves_no_error_and_a_null_err_is_allowed() {
        let mut err: *mut lh_error = std::ptr::NonNull::dangling().as_ptr(); // garbage on entry
        assert_eq!(call(&mut err, || Ok(lh_status::LH_OK)), lh_status::LH_OK);
        assert!(err.is_null());
        let failed = call(std::ptr::null_mut(), || Err(Failure::argument("x")));
        assert_eq!(failed, lh_status::LH_INVALID_ARGUMENT);
    }
}
