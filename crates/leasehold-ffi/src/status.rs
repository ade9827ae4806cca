//! The status codes every call returns, the error object (`lh_error`) a failed call hands back,
//! and the strings this library allocates.

use crate::boundary;
use leasehold_core::Error;
use std::ffi::{c_char, CStr, CString};
use std::time::Duration;

/// What a call did. `LH_OK` is success; `LH_HELD` is the answer of a try-acquire on a key
/// held elsewhere (not an error: no `lh_error` is made); every other status comes with an
/// `lh_error` when the call was given a non-NULL `err`. The numbers are stable.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum lh_status {
    /// Done.
    LH_OK = 0,
    /// A try-acquire found the key held elsewhere (or by another task of this `lh_locks`):
    /// nothing was taken, `*out` is NULL and no error is made.
    LH_HELD = 1,
    /// The call's `lh_cancel` was fired: nothing it started is left behind (an acquisition's
    /// waiter place is withdrawn and a lease granted meanwhile released).
    LH_CANCELLED = 2,
    /// An acquisition waited for its whole wait limit (or `wait_ms = 0` found the key held):
    /// `lh_error_holder` names who held it, `lh_error_waited_ms` says how long it waited.
    LH_TIMEOUT = 3,
    /// The lease was lost (expired, taken over or force-released) before it was released.
    LH_LOST = 4,
    /// An argument of the call itself is unusable: a NULL pointer where one is required, a
    /// string that is not UTF-8, an unknown mode.
    LH_INVALID_ARGUMENT = 5,
    /// The key is not acceptable (empty, too long, control characters).
    LH_INVALID_KEY = 6,
    /// The store URL could not be understood (unknown scheme or parameter, bad value).
    LH_INVALID_URL = 7,
    /// A lock option has a value that cannot work (a TTL of zero, a renewal period past the TTL,
    /// a semaphore count out of range or different from the key's).
    LH_INVALID_OPTION = 8,
    /// The URL names a store this library was built without.
    LH_FEATURE_NOT_ENABLED = 9,
    /// The store cannot honour the request (permits on a store without them).
    LH_NOT_SUPPORTED = 10,
    /// The store could not be reached or did not answer in time; a retry may help.
    LH_UNAVAILABLE = 11,
    /// The store refused the request or answered something not understood
    /// (`lh_error_retryable` says whether a retry can help).
    LH_STORE_ERROR = 12,
    /// The record stored for the key cannot be understood.
    LH_CORRUPT = 13,
    /// An I/O error on a local resource (the file store's directory).
    LH_IO = 14,
    /// The store gave up an acquisition its caller had given up.
    LH_GIVEN_UP = 15,
    /// The thing named does not exist.
    LH_NOT_FOUND = 16,
    /// Called in a child process forked after this library started its runtime in the parent:
    /// refused, as the runtime's threads did not survive the fork.
    LH_FORKED = 17,
    /// A defect or resource failure of this library (the runtime could not start).
    LH_INTERNAL = 18,
    /// A panic inside this library, caught at the boundary; the message says where.
    LH_PANIC = 19,
}

impl lh_status {
    /// The status's name, as in the header.
    fn name(self) -> &'static CStr {
        match self {
            lh_status::LH_OK => c"LH_OK",
            lh_status::LH_HELD => c"LH_HELD",
            lh_status::LH_CANCELLED => c"LH_CANCELLED",
            lh_status::LH_TIMEOUT => c"LH_TIMEOUT",
            lh_status::LH_LOST => c"LH_LOST",
            lh_status::LH_INVALID_ARGUMENT => c"LH_INVALID_ARGUMENT",
            lh_status::LH_INVALID_KEY => c"LH_INVALID_KEY",
            lh_status::LH_INVALID_URL => c"LH_INVALID_URL",
            lh_status::LH_INVALID_OPTION => c"LH_INVALID_OPTION",
            lh_status::LH_FEATURE_NOT_ENABLED => c"LH_FEATURE_NOT_ENABLED",
            lh_status::LH_NOT_SUPPORTED => c"LH_NOT_SUPPORTED",
            lh_status::LH_UNAVAILABLE => c"LH_UNAVAILABLE",
            lh_status::LH_STORE_ERROR => c"LH_STORE_ERROR",
            lh_status::LH_CORRUPT => c"LH_CORRUPT",
            lh_status::LH_IO => c"LH_IO",
            lh_status::LH_GIVEN_UP => c"LH_GIVEN_UP",
            lh_status::LH_NOT_FOUND => c"LH_NOT_FOUND",
            lh_status::LH_FORKED => c"LH_FORKED",
            lh_status::LH_INTERNAL => c"LH_INTERNAL",
            lh_status::LH_PANIC => c"LH_PANIC",
        }
    }

    /// Every status, in number order.
    const ALL: [lh_status; 20] = [
        lh_status::LH_OK,
        lh_status::LH_HELD,
        lh_status::LH_CANCELLED,
        lh_status::LH_TIMEOUT,
        lh_status::LH_LOST,
        lh_status::LH_INVALID_ARGUMENT,
        lh_status::LH_INVALID_KEY,
        lh_status::LH_INVALID_URL,
        lh_status::LH_INVALID_OPTION,
        lh_status::LH_FEATURE_NOT_ENABLED,
        lh_status::LH_NOT_SUPPORTED,
        lh_status::LH_UNAVAILABLE,
        lh_status::LH_STORE_ERROR,
        lh_status::LH_CORRUPT,
        lh_status::LH_IO,
        lh_status::LH_GIVEN_UP,
        lh_status::LH_NOT_FOUND,
        lh_status::LH_FORKED,
        lh_status::LH_INTERNAL,
        lh_status::LH_PANIC,
    ];
}

/// What failed: made by a failed call, owned by the caller, freed with `lh_error_free`.
/// Read-only, so it may be read from several threads at once.
#[derive(Debug)]
pub struct lh_error {
    code: lh_status,
    message: CString,
    key: Option<CString>,
    holder: Option<CString>,
    waited_ms: u64,
    retryable: bool,
}

/// A failure on its way to becoming an `lh_error`.
#[derive(Debug)]
pub(crate) struct Failure {
    code: lh_status,
    message: String,
    key: Option<String>,
    holder: Option<String>,
    waited: Duration,
    retryable: bool,
}

impl Failure {
    /// A failure of `code` saying `message`, with no other detail.
    pub(crate) fn new(code: lh_status, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            key: None,
            holder: None,
            waited: Duration::ZERO,
            retryable: false,
        }
    }

    /// `LH_INVALID_ARGUMENT`.
    pub(crate) fn argument(message: impl Into<String>) -> Self {
        Failure::new(lh_status::LH_INVALID_ARGUMENT, message)
    }

    /// `LH_CANCELLED`, for `what`.
    pub(crate) fn cancelled(what: &str) -> Self {
        Failure::new(
            lh_status::LH_CANCELLED,
            format!("{what} cancelled by its lh_cancel"),
        )
    }

    /// `LH_INTERNAL`.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Failure::new(
            lh_status::LH_INTERNAL,
            format!("leasehold internal error: {}", message.into()),
        )
    }

    /// The same failure about `key`.
    pub(crate) fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    /// The status it returns.
    pub(crate) fn code(&self) -> lh_status {
        self.code
    }

    /// The error object handed to the caller.
    pub(crate) fn into_error(self) -> lh_error {
        lh_error {
            code: self.code,
            message: c_string(self.message),
            key: self.key.map(c_string),
            holder: self.holder.map(c_string),
            waited_ms: u64::try_from(self.waited.as_millis()).unwrap_or(u64::MAX),
            retryable: self.retryable,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let retryable = e.is_retryable();
        let message = e.to_string();
        let (code, key, holder, waited) = match e {
            Error::InvalidKey { key, .. } => (lh_status::LH_INVALID_KEY, Some(key), None, None),
            Error::InvalidUrl { .. } => (lh_status::LH_INVALID_URL, None, None, None),
            Error::InvalidOption { .. } => (lh_status::LH_INVALID_OPTION, None, None, None),
            Error::FeatureNotEnabled { .. } => {
                (lh_status::LH_FEATURE_NOT_ENABLED, None, None, None)
            }
            Error::Timeout {
                key,
                holder,
                waited,
            } => (lh_status::LH_TIMEOUT, Some(key), Some(holder), Some(waited)),
            Error::Corrupt { key, .. } => (lh_status::LH_CORRUPT, Some(key), None, None),
            Error::Io { .. } => (lh_status::LH_IO, None, None, None),
            Error::Unavailable { .. } => (lh_status::LH_UNAVAILABLE, None, None, None),
            Error::NotSupported { .. } => (lh_status::LH_NOT_SUPPORTED, None, None, None),
            Error::GivenUp { key } => (lh_status::LH_GIVEN_UP, Some(key), None, None),
            Error::NotFound { .. } => (lh_status::LH_NOT_FOUND, None, None, None),
            // `Error::Store`, and whatever the library adds later.
            _ => (lh_status::LH_STORE_ERROR, None, None, None),
        };
        Failure {
            code,
            message,
            key,
            holder,
            waited: waited.unwrap_or_default(),
            retryable,
        }
    }
}

/// `s` as a C string; an interior NUL (never in the library's messages) shows as `\0`.
pub(crate) fn c_string(s: impl Into<String>) -> CString {
    let s = s.into();
    CString::new(s).unwrap_or_else(|e| {
        let escaped = String::from_utf8_lossy(&e.into_vec()).replace('\0', "\\0");
        CString::new(escaped).unwrap_or_default()
    })
}

/// `s` as a string the caller owns and frees with `lh_string_free`.
pub(crate) fn owned_string(s: impl Into<String>) -> *mut c_char {
    c_string(s).into_raw()
}

/// The status code of `err` (`LH_INVALID_ARGUMENT` for NULL).
///
/// # Safety
/// `err` is NULL or an `lh_error` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn lh_error_code(err: *const lh_error) -> lh_status {
    boundary::value(lh_status::LH_PANIC, || {
        // SAFETY: the caller passes NULL or a live error.
        unsafe { err.as_ref() }.map_or(lh_status::LH_INVALID_ARGUMENT, |e| e.code)
    })
}

/// What failed, in words (UTF-8, NUL-terminated). Owned by `err`: valid until
/// `lh_error_free(err)`, never NULL for a non-NULL `err` ("" for NULL).
///
/// # Safety
/// `err` is NULL or an `lh_error` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn lh_error_message(err: *const lh_error) -> *const c_char {
    boundary::value(c"".as_ptr(), || {
        // SAFETY: the caller passes NULL or a live error.
        unsafe { err.as_ref() }.map_or(c"".as_ptr(), |e| e.message.as_ptr())
    })
}

/// The key the failure is about (an invalid key, escaped; the key of a timeout), or NULL.
/// Owned by `err`: valid until `lh_error_free(err)`.
///
/// # Safety
/// `err` is NULL or an `lh_error` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn lh_error_key(err: *const lh_error) -> *const c_char {
    boundary::value(std::ptr::null(), || {
        // SAFETY: the caller passes NULL or a live error.
        unsafe { err.as_ref() }
            .and_then(|e| e.key.as_ref())
            .map_or(std::ptr::null(), |k| k.as_ptr())
    })
}

/// For `LH_TIMEOUT`: who held the key as last seen (a holder id, `nobody (reserved for waiter
/// W)`, `another task of this process`, or `unknown (…)` with why). NULL for other statuses.
/// Owned by `err`: valid until `lh_error_free(err)`.
///
/// # Safety
/// `err` is NULL or an `lh_error` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn lh_error_holder(err: *const lh_error) -> *const c_char {
    boundary::value(std::ptr::null(), || {
        // SAFETY: the caller passes NULL or a live error.
        unsafe { err.as_ref() }
            .and_then(|e| e.holder.as_ref())
            .map_or(std::ptr::null(), |h| h.as_ptr())
    })
}

/// For `LH_TIMEOUT`: how long the acquisition waited, in milliseconds; 0 for other statuses.
///
/// # Safety
/// `err` is NULL or an `lh_error` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn lh_error_waited_ms(err: *const lh_error) -> u64 {
    boundary::value(0, || {
        // SAFETY: the caller passes NULL or a live error.
        unsafe { err.as_ref() }.map_or(0, |e| e.waited_ms)
    })
}

/// Whether the same call may succeed if tried again later (the store was unreachable or busy).
/// Input errors, timeouts and cancellations are not retryable.
///
/// # Safety
/// `err` is NULL or an `lh_error` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn lh_error_retryable(err: *const lh_error) -> bool {
    boundary::value(false, || {
        // SAFETY: the caller passes NULL or a live error.
        unsafe { err.as_ref() }.is_some_and(|e| e.retryable)
    })
}

/// Frees an error made by a failed call (and the strings it owns). NULL is ignored.
///
/// # Safety
/// `err` is NULL or an `lh_error` not yet freed; it must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn lh_error_free(err: *mut lh_error) {
    boundary::value((), || {
        if !err.is_null() {
            // SAFETY: made by `Box::into_raw` in `boundary::call`, freed once (the caller's
            // promise).
            drop(unsafe { Box::from_raw(err) });
        }
    })
}

/// The name of a status (`"LH_TIMEOUT"`), or `"LH_UNKNOWN"` for a number that is none.
/// A static string: never freed.
#[no_mangle]
pub extern "C" fn lh_status_name(status: u32) -> *const c_char {
    boundary::value(c"LH_UNKNOWN".as_ptr(), || {
        lh_status::ALL
            .iter()
            .find(|s| **s as u32 == status)
            .map_or(c"LH_UNKNOWN".as_ptr(), |s| s.name().as_ptr())
    })
}

/// Frees a string this library allocated for the caller (JSON text, a lost reason, a waiter's
/// identity). NULL is ignored.
///
/// # Safety
/// `s` is NULL or a string returned through an out-pointer of this library and not yet freed;
/// never a string owned by a handle (`lh_error_message`, `lh_lease_key`, …).
#[no_mangle]
pub unsafe extern "C" fn lh_string_free(s: *mut c_char) {
    boundary::value((), || {
        if !s.is_null() {
            // SAFETY: made by `CString::into_raw` in `owned_string`, freed once.
            drop(unsafe { CString::from_raw(s) });
        }
    })
}

/// This library's version (`"0.1.0"`). A static string: never freed.
#[no_mangle]
pub extern "C" fn lh_version() -> *const c_char {
    static VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}
