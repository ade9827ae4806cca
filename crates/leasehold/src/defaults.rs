//! Where the `leasehold` command, the Python package and the C ABI look when no store (or queue)
//! is named: one rule, here, so that each of them finds the same locks and the same queue.
//!
//! - The store: [`STORE_ENV`] when set, else the file store under the user's state directory
//!   ([`store_url`]).
//! - The queue: [`QUEUE_ENV`] when set, else `sqlite://<state dir>/leasehold/queue.db`, next to
//!   the default store ([`queue_url`]).
//! - The store a queue worker takes its key leases from: the one named; else, for a queue on
//!   PostgreSQL, the same database; else the default store ([`worker_store_url`]).
//!
//! The functions take what the caller was given (a `--store` flag, a keyword argument) and read
//! no environment themselves: the `_from_env` forms do.
//!
//! ```
//! use leasehold::defaults;
//! assert_eq!(defaults::store_url(Some("redis://r:6379/0"))?, "redis://r:6379/0");
//! let file = defaults::store_url(None)?;
//! assert!(file.starts_with("file:///") && file.ends_with("/leasehold/locks/"), "{file}");
//! # Ok::<(), leasehold::Error>(())
//! ```

use crate::error::{Error, Result};
use std::path::PathBuf;

/// The environment variable naming the lock store (`LEASEHOLD_STORE`).
pub const STORE_ENV: &str = "LEASEHOLD_STORE";

/// The environment variable naming the queue (`LEASEHOLD_QUEUE`).
pub const QUEUE_ENV: &str = "LEASEHOLD_QUEUE";

/// The user's state directory: `$XDG_STATE_HOME` (or `~/.local/state`, as `dirs::state_dir`
/// finds it), else `$HOME/.local/state`, else the temporary directory.
pub fn state_dir() -> PathBuf {
    dirs::state_dir()
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("state"))
        })
        .unwrap_or_else(std::env::temp_dir)
}

/// The default store's directory: `<state dir>/leasehold/locks`.
pub fn store_dir() -> PathBuf {
    state_dir().join("leasehold").join("locks")
}

/// `given` when it is not blank.
fn named(given: Option<&str>) -> Option<&str> {
    given.map(str::trim).filter(|s| !s.is_empty())
}

/// The variable `name` of the environment, when set to something not blank.
fn from_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The store URL in effect: `given` when it is not blank, else the file store in
/// [`store_dir`] (as a `file:///…/` URL).
///
/// # Errors
/// [`Error::InvalidUrl`] when the default directory is not an absolute path (a relative
/// `$HOME`), so that it cannot be written as a URL.
pub fn store_url(given: Option<&str>) -> Result<String> {
    if let Some(url) = named(given) {
        return Ok(url.to_owned());
    }
    let dir = store_dir();
    url::Url::from_directory_path(&dir)
        .map(String::from)
        .map_err(|()| Error::InvalidUrl {
            url: dir.display().to_string(),
            reason: "the default store directory is not an absolute path: name a store URL".into(),
        })
}

/// [`store_url`] of [`STORE_ENV`]'s value.
///
/// # Errors
/// As [`store_url`].
pub fn store_url_from_env() -> Result<String> {
    store_url(from_env(STORE_ENV).as_deref())
}

/// The queue URL in effect: `given` when it is not blank, else
/// `sqlite://<state dir>/leasehold/queue.db` (next to the default store).
///
/// ```
/// let q = leasehold::defaults::queue_url(None);
/// assert!(q.starts_with("sqlite:///") && q.ends_with("/leasehold/queue.db"), "{q}");
/// assert_eq!(leasehold::defaults::queue_url(Some(" sqlite:///q.db ")), "sqlite:///q.db");
/// ```
#[cfg(feature = "queue")]
pub fn queue_url(given: Option<&str>) -> String {
    match named(given) {
        Some(url) => url.to_owned(),
        None => format!("sqlite://{}", queue_path().display()),
    }
}

/// The default queue's file: `<state dir>/leasehold/queue.db` (created by the first command that
/// opens it).
///
/// ```
/// let path = leasehold::defaults::queue_path();
/// assert!(path.ends_with("leasehold/queue.db"), "{}", path.display());
/// ```
#[cfg(feature = "queue")]
pub fn queue_path() -> PathBuf {
    state_dir().join("leasehold").join("queue.db")
}

/// [`queue_url`] of [`QUEUE_ENV`]'s value.
#[cfg(feature = "queue")]
pub fn queue_url_from_env() -> String {
    queue_url(from_env(QUEUE_ENV).as_deref())
}

/// The store a worker of the queue `queue` takes its key leases from: `store` when it is not
/// blank; else, for a queue on PostgreSQL, the same database (its lease table, so that workers
/// on many hosts need one server); else the default store ([`store_url`]).
///
/// ```
/// use leasehold::defaults::worker_store_url;
/// let pg = "postgres://u@db:5432/jobs";
/// assert_eq!(worker_store_url(None, pg)?, pg);
/// assert_eq!(worker_store_url(Some("redis://r/0"), pg)?, "redis://r/0");
/// assert!(worker_store_url(None, "sqlite:///q.db")?.starts_with("file:///"));
/// # Ok::<(), leasehold::Error>(())
/// ```
///
/// # Errors
/// As [`store_url`].
#[cfg(feature = "queue")]
pub fn worker_store_url(store: Option<&str>, queue: &str) -> Result<String> {
    if named(store).is_none() {
        let scheme = queue.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        if matches!(scheme.as_deref(), Some("postgres" | "postgresql")) {
            return Ok(queue.trim().to_owned());
        }
    }
    store_url(store)
}

/// [`worker_store_url`] with [`STORE_ENV`]'s value as the store.
///
/// # Errors
/// As [`store_url`].
#[cfg(feature = "queue")]
pub fn worker_store_url_from_env(queue: &str) -> Result<String> {
    worker_store_url(from_env(STORE_ENV).as_deref(), queue)
}

#[cfg(all(test, feature = "queue"))]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_queue_takes_its_leases_from_its_database() {
        let pg = "postgres://w@db/jobs?sslmode=require";
        assert_eq!(worker_store_url(None, pg).ok().as_deref(), Some(pg));
        assert_eq!(
            worker_store_url(Some(" "), "POSTGRESQL://db/j")
                .ok()
                .as_deref(),
            Some("POSTGRESQL://db/j")
        );
        assert_eq!(
            worker_store_url(Some("redis://r"), pg).ok().as_deref(),
            Some("redis://r")
        );
        let other = worker_store_url(None, "sqlite:///q.db").unwrap_or_default();
        assert!(other.starts_with("file:///"), "{other}");
    }

    #[test]
    fn the_default_queue_sits_next_to_the_default_store() {
        let (q, s) = (queue_url(None), store_url(None).unwrap_or_default());
        let dir = |u: &str, tail: &str| {
            u.split_once("://")
                .map(|(_, p)| p.trim_start_matches("/").trim_end_matches(tail).to_owned())
        };
        assert_eq!(dir(&q, "queue.db"), dir(&s, "locks/"), "{q} {s}");
    }
}
