//! The one error type of leasehold.
//!
//! Contention is not an error: [`crate::LockBuilder::try_acquire`] answers `Ok(None)` when another
//! holder has the lease. Errors say what went wrong and whether a retry can help
//! ([`Error::is_retryable`]).

use std::time::Duration;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, by meaning. Each store converts its private errors into these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is not acceptable (empty, too long, contains NUL or control characters, not UTF-8).
    #[error("invalid key {key}: {reason}")]
    InvalidKey {
        /// The offending key, escaped for display and cut to 80 characters.
        key: String,
        /// Why it was refused.
        reason: String,
    },
    /// The store URL could not be understood.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given (credentials removed).
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// An option has a value that cannot work (for example a TTL of zero).
    #[error("invalid option {name}: {reason}")]
    InvalidOption {
        /// The option's name.
        name: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The URL names a store whose Cargo feature is not compiled in.
    #[error("store scheme {scheme:?} needs the Cargo feature {feature:?} of leasehold")]
    FeatureNotEnabled {
        /// The URL scheme.
        scheme: String,
        /// The feature to enable.
        feature: &'static str,
    },
    /// `acquire` waited for its whole wait limit and the lease was still held.
    #[error("timed out after {waited:?} waiting for {key}: held by {holder}")]
    Timeout {
        /// The key waited for.
        key: String,
        /// Who kept the lease, as last seen: a holder id, `"nobody (reserved for waiter W)"`,
        /// `"another task of this process"`, or `"unknown (…)"` with why (a store error, no
        /// answer within the wait limit).
        holder: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The record stored for a key cannot be understood.
    #[error("corrupt record for {key}: {detail}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong with it.
        detail: String,
    },
    /// An operating-system I/O error on a local resource.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The store could not be reached or did not answer in time; a retry may help.
    #[error("store {store} unavailable: {detail}")]
    Unavailable {
        /// The store (URL without credentials).
        store: String,
        /// What happened.
        detail: String,
    },
    /// The store answered something leasehold does not understand or refused the request.
    #[error("store {store} error: {detail}")]
    Store {
        /// The store (URL without credentials).
        store: String,
        /// What happened.
        detail: String,
        /// Whether a retry can help.
        retryable: bool,
    },
    /// The store cannot honour the requested guarantee; it never weakens it silently.
    #[error("not supported by {store}: {what}")]
    NotSupported {
        /// The store.
        store: String,
        /// What is not supported.
        what: String,
    },
    /// The caller gave an acquisition up ([`crate::store::AcquireRequest::given_up`]) while the
    /// store was still retrying it; the attempt stopped before writing anything more.
    #[error("acquisition of {key} given up by its caller")]
    GivenUp {
        /// The key.
        key: String,
    },
    /// The named thing (a queue task, …) does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for, e.g. `task 42`.
        what: String,
    },
}

/// The detail of an [`Error::Unavailable`] for a call that ran out of time.
#[cfg(any(feature = "redis", feature = "queue-postgres"))]
pub(crate) const NO_ANSWER: &str = "no answer in time";

impl Error {
    /// [`Error::Unavailable`] for a call to `store` that ran out of time ([`NO_ANSWER`]).
    #[cfg(any(feature = "redis", feature = "queue-postgres"))]
    pub(crate) fn no_answer(store: impl Into<String>) -> Self {
        Error::Unavailable {
            store: store.into(),
            detail: NO_ANSWER.into(),
        }
    }

    /// Whether this is a call that ran out of time ([`NO_ANSWER`]).
    #[cfg(any(feature = "redlock", feature = "queue-postgres"))]
    pub(crate) fn is_no_answer(&self) -> bool {
        matches!(self, Error::Unavailable { detail, .. } if detail == NO_ANSWER)
    }

    /// Whether retrying the same call later can succeed (the store was unreachable, busy, or a
    /// transient I/O error happened). Input errors, corrupt records and timeouts are not retryable.
    ///
    /// ```
    /// use leasehold::Error;
    /// use std::io::{Error as IoError, ErrorKind};
    /// let e = Error::Unavailable { store: "redis://x".into(), detail: "refused".into() };
    /// assert!(e.is_retryable());
    /// let busy = |retryable| Error::Store { store: "s".into(), detail: "busy".into(), retryable };
    /// assert!(busy(true).is_retryable() && !busy(false).is_retryable());
    /// let io = |kind| Error::Io { op: "read", path: "/x".into(), source: IoError::from(kind) };
    /// assert!(io(ErrorKind::TimedOut).is_retryable());
    /// assert!(!io(ErrorKind::PermissionDenied).is_retryable());
    /// assert!(!leasehold::Key::new("").unwrap_err().is_retryable()); // an input error
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unavailable { .. } => true,
            Error::Store { retryable, .. } => *retryable,
            Error::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted
                    | std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
            ),
            _ => false,
        }
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl std::fmt::Display,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            op,
            path: path.to_string(),
            source,
        }
    }

    pub(crate) fn option(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOption {
            name,
            reason: reason.into(),
        }
    }
}
