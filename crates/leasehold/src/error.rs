//! The one error type of leasehold.

use std::time::Duration;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The underlying cause of a store error: the client library's own error (a `redis::RedisError`,
/// a `kube::Error`, a `tokio_postgres::Error`, …), shared because one failed call can fail several
/// batched operations.
pub type Source = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong, by meaning. Each store converts its private errors into these.
///
/// Contention is not an error: [`crate::LockBuilder::try_acquire`] answers `Ok(None)` when another
/// holder has the lease. Errors say what went wrong and whether a retry can help
/// ([`Error::is_retryable`]).
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
        /// The client library's error behind it, when there is one.
        #[source]
        source: Option<Source>,
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
        /// The client library's error behind it, when there is one.
        #[source]
        source: Option<Source>,
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

/// The cause of an [`Error::Unavailable`] for a call that ran out of time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoAnswer;

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(NO_ANSWER)
    }
}

impl std::error::Error for NoAnswer {}

/// The detail of an [`Error::Unavailable`] for a call that ran out of time.
pub(crate) const NO_ANSWER: &str = "no answer in time";

impl Error {
    /// [`Error::Unavailable`] for a call to `store` that ran out of time (its source is
    /// [`NoAnswer`]).
    #[allow(dead_code)] // without the stores that time calls out
    pub(crate) fn no_answer(store: impl Into<String>) -> Self {
        Error::unavailable(store, NO_ANSWER).caused_by(NoAnswer)
    }

    /// Whether this is a call that ran out of time ([`Error::no_answer`]).
    #[allow(dead_code)] // without the stores that time calls out
    pub(crate) fn is_no_answer(&self) -> bool {
        self.cause()
            .is_some_and(|s| s.downcast_ref::<NoAnswer>().is_some())
    }

    /// [`Error::Unavailable`] without a source (add one with [`Error::caused_by`]).
    pub(crate) fn unavailable(store: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Unavailable {
            store: store.into(),
            detail: detail.into(),
            source: None,
        }
    }

    /// The same error with `cause` as the source of an [`Error::Unavailable`] or [`Error::Store`]
    /// (other variants are returned as they are).
    pub(crate) fn caused_by(
        mut self,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        if let Error::Unavailable { source, .. } | Error::Store { source, .. } = &mut self {
            *source = Some(std::sync::Arc::new(cause));
        }
        self
    }

    /// The shared source of an [`Error::Unavailable`] or [`Error::Store`], if it has one.
    #[allow(dead_code)] // without the stores that batch calls
    pub(crate) fn source_arc(&self) -> Option<Source> {
        match self {
            Error::Unavailable { source, .. } | Error::Store { source, .. } => source.clone(),
            _ => None,
        }
    }

    /// The source of an [`Error::Unavailable`] or [`Error::Store`], if it has one.
    fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Unavailable { source, .. } | Error::Store { source, .. } => source.as_deref(),
            _ => None,
        }
    }

    /// Whether retrying the same call later can succeed (the store was unreachable, busy, or a
    /// transient I/O error happened). Input errors, corrupt records and timeouts are not retryable.
    ///
    /// ```
    /// use leasehold::Error;
    /// use std::io::{Error as IoError, ErrorKind};
    /// let e = Error::Unavailable { store: "redis://x".into(), detail: "refused".into(), source: None };
    /// assert!(e.is_retryable());
    /// let busy = |retryable| Error::Store { store: "s".into(), detail: "busy".into(), retryable, source: None };
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

    /// This error again, for each caller of a call that carried several callers' operations (a
    /// batch): an [`Error::Unavailable`] as it is (its source shared, so a timeout stays one),
    /// anything else as an [`Error::Store`] of `store` with its text and retryability.
    #[allow(dead_code)] // without the stores that batch calls
    pub(crate) fn shared(&self, store: &str) -> Error {
        match self {
            Error::Unavailable {
                store,
                detail,
                source,
            } => Error::Unavailable {
                store: store.clone(),
                detail: detail.clone(),
                source: source.clone(),
            },
            other => Error::Store {
                source: other.source_arc(),
                store: store.to_owned(),
                detail: other.to_string(),
                retryable: other.is_retryable(),
            },
        }
    }

    pub(crate) fn option(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidOption {
            name,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn no_answer_is_told_by_its_source_not_its_text() {
        let timed_out = Error::no_answer("redis://h:1");
        assert!(timed_out.is_no_answer());
        assert_eq!(
            timed_out.to_string(),
            "store redis://h:1 unavailable: no answer in time"
        );
        assert_eq!(
            timed_out.source().map(|s| s.to_string()).as_deref(),
            Some(NO_ANSWER)
        );
        let same_words = Error::unavailable("redis://h:1", NO_ANSWER);
        assert!(!same_words.is_no_answer());
        assert!(timed_out.source_arc().is_some());
    }

    #[test]
    fn a_cause_is_kept_as_the_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let e = Error::unavailable("s", "connection lost").caused_by(io);
        let source = e.source().map(|s| s.to_string());
        assert_eq!(source.as_deref(), Some("reset by peer"));
        assert!(e.is_retryable());
        // Variants without a source are returned as they are.
        let key = crate::key::Key::new("")
            .err()
            .map(|k| k.caused_by(NoAnswer));
        assert!(key.is_some_and(|k| k.source().is_none()));
    }
}
