//! # leasehold — distributed locks and leases with fencing tokens
//!
//! One async API over many stores: [`try_acquire`](LockBuilder::try_acquire) (never waits),
//! [`acquire`](LockBuilder::acquire) (waits up to a limit), a [`LeaseGuard`] that renews itself,
//! signals when the lease is [lost](LeaseGuard::lost) or [wanted](LeaseGuard::handoff_requested), and
//! releases — with a **fencing token** ([`LeaseGuard::fence`]) strictly increasing per key on every
//! store.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! # let dir = tempfile::tempdir().unwrap();
//! # let url = format!("file://{}", dir.path().display());
//! use std::time::Duration;
//! let locks = leasehold::connect(&url).await?; // file:///var/lib/myapp/locks, memory://, …
//! let guard = locks.lock("user:alice")?.ttl(Duration::from_secs(30)).wait(Duration::from_secs(10)).acquire().await?;
//! let fence = guard.fence(); // hand it to the resource: it rejects writes with an older fence
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lost: {reason}"),
//!     waiter = guard.handoff_requested() => eprintln!("{waiter} waits: checkpoint and hand over"),
//!     _ = tokio::time::sleep(Duration::from_millis(1)) => {}
//! }
//! guard.release().await?; // idempotent; dropping the guard releases in the background too
//! # let _ = fence; Ok::<(), leasehold::Error>(()) }).unwrap();
//! ```
//!
//! ## Stores
//! A URL names the store: see [`stores`] for the table of schemes, their stores and Cargo features.
//!
//! Contention is not an error: `try_acquire` answers `Ok(None)`. Store failures are [`Error`]s,
//! with [`Error::is_retryable`].

pub mod adapter;
mod background;
mod carry;
#[cfg(feature = "conformance")]
pub mod conformance;
pub(crate) mod decide;
pub mod defaults;
mod error;
pub mod fence;
pub mod floor;
mod fsmode;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod guard;
mod holder;
mod inotify;
mod key;
mod local;
mod metrics;
mod options;
#[cfg(feature = "postgres")]
mod pg;
#[cfg(feature = "queue")]
pub mod queue;
mod record;
#[cfg(feature = "runtime")]
pub mod runtime;
mod store;
pub mod stores;
pub mod traced;
mod url;

mod client;

/// The always-built stores, also at the crate root (`leasehold::memory::MemoryStore`).
#[doc(no_inline)]
pub use stores::{file, memory};

pub use background::settle;
pub use client::{LockBuilder, Locks, ReadWrite};
pub use error::{Error, Result, Source as ErrorSource};
pub use guard::{LeaseGuard, Released, StopReason};
pub use holder::{hostname, HolderId};
pub use key::{Key, Naming};
pub use local::{LocalGuard, LocalLocks};
pub use metrics::Metrics;
pub use options::{Backoff, LockOptions, Wait};
pub use record::{
    format_ms, now_ms, LeaseRecord, Permit, PermitKind, Permits, QueuedWaiter, PERMIT_LIMIT,
    QUEUE_LIMIT,
};
pub use store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    ExpiryClock, GiveUp, Inspection, LockStore, LostReason, PermitRequest, RecordStore,
    ReleaseOutcome, RenewOutcome, Stored, DEFAULT_LABEL_LIMIT,
};

use std::sync::Arc;

/// Hides a URL's passwords for messages: `user:password@` and a `pass=`, `password=` or
/// `sentinel_pass=` query parameter (as `redis+unix://` and `redis+sentinel://` take them) show as
/// `***`.
///
/// ```
/// assert_eq!(leasehold::redact_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
/// assert_eq!(
///     leasehold::redact_url("redis+unix:///run/r.sock?user=u&pass=secret&db=2"),
///     "redis+unix:///run/r.sock?user=u&pass=***&db=2"
/// );
/// assert_eq!(
///     leasehold::redact_url("redis+sentinel://u:secret@s1:1,s2:2/m?sentinel_pass=secret"),
///     "redis+sentinel://***@s1:1,s2:2/m?sentinel_pass=***"
/// );
/// // A secret's name given without a value shows as hidden too.
/// assert_eq!(
///     leasehold::redact_url("redis+unix:///run/r.sock?db=2&user=u&pass"),
///     "redis+unix:///run/r.sock?db=2&user=u&pass=***"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    crate::url::redact(url)
}

/// Opens the store a URL names (see the table in [`stores`]).
///
/// # Errors
/// [`Error::InvalidUrl`] for a URL that does not parse or has unknown parameters,
/// [`Error::FeatureNotEnabled`] for a store compiled out, and the store's own errors (a file store
/// directory that cannot be created).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// assert!(leasehold::open_store("memory://").await.is_ok());
/// assert!(matches!(leasehold::open_store("nope://x").await, Err(leasehold::Error::InvalidUrl { .. })));
/// # });
/// ```
pub async fn open_store(url: &str) -> Result<Arc<dyn LockStore>> {
    stores::open(url).await
}

/// Opens the store a URL names and returns [`Locks`] over it (as [`Locks::from_arc`]: holder id
/// from the environment, local layer on).
///
/// # Errors
/// As [`open_store`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{connect, Error};
/// let dir = tempfile::tempdir().unwrap();
/// let locks = connect(&format!("file://{}?mode=0640&fsync=true", dir.path().display())).await?;
/// locks.lock("k")?.try_acquire().await?.expect("free").release().await?;
/// assert!(connect("memory://").await.is_ok());
/// let unknown = connect(&format!("file://{}?colour=red", dir.path().display())).await;
/// assert!(matches!(unknown, Err(Error::InvalidUrl { .. })));
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
pub async fn connect(url: &str) -> Result<Locks> {
    Ok(Locks::from_arc(open_store(url).await?))
}
