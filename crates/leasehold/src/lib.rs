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
//! | URL | module | feature |
//! |---|---|---|
//! | `file:///path/to/dir[?mode=0640&fsync=true]` | [`file`](mod@file) | `file` (default) |
//! | `memory://` | [`memory`] | `memory` (default) |
//! | `record-memory://` (the generic record adapter over memory) | [`memory`], [`adapter`] | `memory` |
//! | `k8s://[namespace][?prefix=…&server=…]`, `kubernetes://…` (Lease objects) | `kubernetes` | `kubernetes` |
//! | `redis://[user:pass@]host:port/db[?prefix=…&timeout=…]`, `rediss://…[?ca=…]`, `redis+unix:///path/redis.sock[?db=…&user=…&pass=…]`, `redis+sentinel://[user:pass@]s1:26379,s2:26379/MASTER[/db]` | `redis` | `redis` |
//! | `redis+cluster://[user:pass@]h1:p1,h2:p2,…[?prefix=…]`, `rediss+cluster://…[?ca=…]` (Redis Cluster) | `redis_cluster` | `redis-cluster` |
//! | `redlock://host1:port1,host2:port2,host3:port3[/db]` | `redlock` | `redlock` |
//!
//! Contention is not an error: `try_acquire` answers `Ok(None)`. Store failures are [`Error`]s,
//! with [`Error::is_retryable`].

pub mod adapter;
mod background;
pub mod decide;
pub mod error;
pub mod file;
pub mod guard;
pub mod holder;
pub mod key;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod local;
pub mod memory;
pub mod metrics;
pub mod options;
#[cfg(feature = "queue-postgres")]
mod postgres_tls;
#[cfg(feature = "queue")]
pub mod queue;
pub mod record;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis-cluster")]
pub mod redis_cluster;
#[cfg(feature = "redlock")]
pub mod redlock;
pub mod store;
pub mod traced;

mod client;

pub use background::settle;
pub use client::{LockBuilder, Locks};
pub use error::{Error, Result};
pub use guard::{LeaseGuard, Released};
pub use holder::HolderId;
pub use key::{Key, Naming};
pub use local::{LocalGuard, LocalLocks};
pub use metrics::Metrics;
pub use options::{Backoff, LockOptions, Wait};
pub use record::LeaseRecord;
pub use store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupReport, Inspection,
    LockStore, LostReason, RecordStore, ReleaseOutcome, RenewOutcome, Stored,
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
/// ```
pub fn redact_url(url: &str) -> String {
    let (main, query) = match url.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (url, None),
    };
    let main = match url::Url::parse(main) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        // Not a URL the parser takes (several hosts): whatever precedes an `@` goes.
        Err(_) => match (main.find("://"), main.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}***{}", &main[..s + 3], &main[at..]),
            _ => main.to_owned(),
        },
    };
    let Some(query) = query else { return main };
    let secret = |k: &str| matches!(k, "pass" | "password" | "sentinel_pass");
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if secret(k) => format!("{k}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{main}?{}", pairs.join("&"))
}

/// Opens the store a URL names (see the table in the crate docs).
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
    let bad = |reason: &str| Error::InvalidUrl {
        url: redact_url(url),
        reason: reason.into(),
    };
    let scheme = match url.split_once("://") {
        Some((s, _))
            if !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            s.to_ascii_lowercase()
        }
        _ => {
            return Err(bad(
                "expected SCHEME://…, e.g. file:///var/lib/locks or redis://127.0.0.1:6379/0",
            ))
        }
    };
    #[cfg(feature = "redlock")]
    if scheme == "redlock" {
        return Ok(Arc::new(crate::redlock::RedlockStore::from_url(url).await?));
    }
    #[cfg(feature = "redis")]
    if scheme == "redis+sentinel" || scheme == "rediss+sentinel" {
        return Ok(Arc::new(
            crate::redis::RedisStore::from_sentinel_url(url).await?,
        ));
    }
    #[cfg(feature = "redis-cluster")]
    if scheme == "redis+cluster" || scheme == "rediss+cluster" {
        return Ok(Arc::new(
            crate::redis::RedisStore::from_cluster_url(url).await?,
        ));
    }
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    let not_enabled = |feature: &'static str| Error::FeatureNotEnabled {
        scheme: scheme.clone(),
        feature,
    };
    match scheme.as_str() {
        "memory" => Ok(Arc::new(memory::MemoryStore::new())),
        "record-memory" => Ok(Arc::new(adapter::RecordLockStore::new(memory::RecordMemoryStore::new()))),
        "file" => Ok(Arc::new(file::FileStore::from_url(&parsed)?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" => {
            Ok(Arc::new(crate::redis::RedisStore::from_url(&parsed).await?))
        }
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" | "redis+unix" | "redis+sentinel" | "rediss+sentinel" => {
            Err(not_enabled("redis"))
        }
        "redlock" => Err(not_enabled("redlock")),
        "redis+cluster" | "rediss+cluster" => Err(not_enabled("redis-cluster")),
        #[cfg(feature = "kubernetes")]
        "k8s" | "kubernetes" => Ok(Arc::new(adapter::RecordLockStore::new(
            crate::kubernetes::KubernetesStore::from_url(&parsed).await?,
        ))),
        #[cfg(not(feature = "kubernetes"))]
        "k8s" | "kubernetes" => Err(not_enabled("kubernetes")),
        // Planned stores: no Cargo feature turns them on yet.
        "gs" | "gcs" | "s3" | "postgres" | "postgresql" | "etcd" => Err(bad(&format!(
            "the {scheme}:// store is not in this version of leasehold (stores: file, memory, redis and its variants, redlock, k8s)"
        ))),
        _ => Err(bad("unknown scheme (known: file, memory, record-memory, redis, rediss, redis+unix, redis+sentinel, rediss+sentinel, redis+cluster, rediss+cluster, redlock, k8s, gs, s3, postgres, etcd)")),
    }
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
