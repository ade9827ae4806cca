//! What can go wrong when starting a server.

/// Why a server could not be started (or a request to it failed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A program or package the server needs is missing or cannot be run; the message says how to
    /// install it (or which variable names it).
    #[error("{0}")]
    Missing(String),
    /// The server did not come up: it exited, or did not answer in time (with its log when it has
    /// one). For a launcher that tries new ports, every attempt's failure.
    #[error("{0}")]
    NotStarted(String),
    /// A setup step failed: a command such as `initdb` or `openssl`, a request the server
    /// refused, or a deployment that did not settle in time.
    #[error("{0}")]
    Setup(String),
    /// A file or directory of the server could not be made or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// An [`Error::Io`] for `what`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// What the launchers return.
pub type Result<T, E = Error> = std::result::Result<T, E>;
