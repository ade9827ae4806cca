//! Which store and queue to use: `--store`, else `LEASEHOLD_STORE` (clap reads both), else the
//! library's default, a directory under the user's state directory; `--queue`, else
//! `LEASEHOLD_QUEUE`, else the library's default queue beside it.

use crate::exit::Failure;
use leasehold::queue::QueueBackend;
use leasehold::LockStore;
use std::sync::Arc;

/// The store URL in effect: `given` (from `--store` or `LEASEHOLD_STORE`), else the library's
/// default file store ([`leasehold::defaults::store_url`]).
///
/// # Errors
/// A usage error when the default directory cannot be written as a URL (a relative path).
pub(crate) fn url(given: Option<&str>) -> Result<String, Failure> {
    leasehold::defaults::store_url(given)
        .map_err(|e| Failure::usage(format!("{e}; use --store URL")))
}

/// Opens the store.
///
/// # Errors
/// A usage error for a bad URL, an error when the store cannot be opened.
pub(crate) async fn open(given: Option<&str>) -> Result<Arc<dyn LockStore>, Failure> {
    let url = url(given)?;
    tracing::debug!(store = %leasehold::redact_url(&url), "opening store");
    Ok(leasehold::open_store(&url).await?)
}

/// Opens the queue: `given` (from `--queue` or `LEASEHOLD_QUEUE`), else the library's default
/// ([`leasehold::defaults::queue_url`]).
///
/// # Errors
/// A usage error for a bad URL, an error when it cannot be opened.
pub(crate) async fn open_queue(given: Option<&str>) -> Result<Arc<dyn QueueBackend>, Failure> {
    let url = leasehold::defaults::queue_url(given);
    tracing::debug!(queue = %leasehold::redact_url(&url), "opening queue");
    Ok(leasehold::queue::open_queue(&url).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_url_wins_and_blank_means_default() {
        assert_eq!(url(Some("memory://")).unwrap(), "memory://");
        let d = url(Some("  ")).unwrap();
        assert!(
            d.starts_with("file:///") && d.ends_with("/leasehold/locks/"),
            "{d}"
        );
    }
}
