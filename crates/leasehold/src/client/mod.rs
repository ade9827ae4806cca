//! The user's entry point: [`Locks`] over a store, [`LockBuilder`] per key.
//!
//! [`Locks`] is here; [`LockBuilder`]'s options and its public `try_acquire`/`acquire` are in
//! `builder.rs`; the acquisition itself (the local layer, the store attempts, the wait for a change
//! or a timer, the waiter registration and what is undone when a caller leaves) in `acquire.rs`.

use crate::error::Result;
use crate::guard::{LiveSet, Released};
use crate::holder::HolderId;
use crate::key::Key;
use crate::local::LocalLocks;
use crate::metrics::Metrics;
use crate::options::LockOptions;
use crate::store::LockStore;
use crate::store::PermitRequest;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

mod acquire;
mod builder;
mod line;
#[cfg(test)]
mod tests;

pub use builder::LockBuilder;

/// How many releases `release_all` runs at once.
const RELEASE_ALL_IN_FLIGHT: usize = 256;
/// How long `release_all` waits for leases being handed between tasks to land.
const RELEASE_ALL_SETTLE: Duration = Duration::from_secs(5);

/// Locks over one store: hands out [`LockBuilder`]s. Cheap to clone; clones share the store, the
/// local layer and the metrics.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
/// let guard = locks
///     .lock("user:alice")?
///     .ttl(Duration::from_secs(30))
///     .wait(Duration::from_secs(10))
///     .acquire()
///     .await?;
/// guard.release().await?;
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Locks {
    store: Arc<dyn LockStore>,
    holder: HolderId,
    local: Option<Arc<LocalLocks>>,
    metrics: Option<Metrics>,
    defaults: LockOptions,
    live: Arc<LiveSet>,
}

impl Locks {
    /// Locks over `store`, with the holder id from the environment ([`HolderId::from_env`]) and the
    /// local layer on.
    ///
    /// ```
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Locks};
    /// let locks = Locks::new(MemoryStore::new()).with_holder(HolderId::new("web-1"));
    /// assert_eq!(locks.holder().as_str(), "web-1");
    /// ```
    pub fn new(store: impl LockStore) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Locks over a shared store, with the holder id from the environment
    /// ([`HolderId::from_env`]) and the local layer on. Every store call runs in a `tracing` span
    /// ([`crate::traced::Traced`]). Several `Locks` over one store exclude each other like
    /// separate processes would.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Locks, LockStore};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    /// let b = Locks::from_arc(store.clone()).with_holder(HolderId::new("b"));
    /// let held = a.lock("k")?.try_acquire().await?.expect("free");
    /// assert!(b.lock("k")?.try_acquire().await?.is_none());
    /// // The store is still yours to use directly.
    /// assert_eq!(store.list("").await?.len(), 1);
    /// # held.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn from_arc(store: Arc<dyn LockStore>) -> Self {
        let store: Arc<dyn LockStore> = Arc::new(crate::traced::Traced::new(store));
        Locks {
            store,
            holder: HolderId::from_env(),
            local: Some(LocalLocks::new()),
            metrics: None,
            defaults: LockOptions::default(),
            live: Arc::default(),
        }
    }

    /// Uses `holder` as this process's identity: it is written into every lease taken through
    /// this `Locks` and shown to contenders. Two acquisitions under one holder id are still told
    /// apart by their owner tokens: the second is refused while the first holds the key.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Locks};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let one = Locks::from_arc(store.clone()).with_holder(HolderId::new("web-1"));
    /// let same = Locks::from_arc(store).with_holder(HolderId::new("web-1"));
    /// let guard = one.lock("k")?.try_acquire().await?.expect("free");
    /// assert_eq!(guard.record().holder.as_deref(), Some("web-1"));
    /// assert!(same.lock("k")?.try_acquire().await?.is_none(), "never granted twice");
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn with_holder(mut self, holder: HolderId) -> Self {
        self.holder = holder;
        self
    }

    /// Turns the in-process layer off (every task talks to the store) or on (default).
    ///
    /// With it on, tasks of this process waiting for one key queue in the process (first come,
    /// first served, [`queued`](Self::queued)) and a released lease can pass to the next of them
    /// without a store call. With it off, every task is a contender in the store like any other
    /// process, and `queued` answers 0.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, Locks};
    /// let locks = Locks::new(MemoryStore::new()).with_local_layer(false);
    /// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
    /// assert!(locks.lock("k")?.try_acquire().await?.is_none()); // refused by the store
    /// assert_eq!(locks.queued(guard.key()), 0);
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn with_local_layer(mut self, on: bool) -> Self {
        self.local = on.then(LocalLocks::new);
        self
    }

    /// Records Prometheus metrics (see [`Metrics`] for their names) for every lock made from
    /// here and from its clones.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, Locks, Metrics};
    /// let registry = prometheus::Registry::new();
    /// let locks = Locks::new(MemoryStore::new())
    ///     .with_metrics(Metrics::register("myapp_locks", &registry)?);
    /// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
    /// assert!(locks.lock("k")?.try_acquire().await?.is_none());
    /// let text = Metrics::render(&registry);
    /// assert!(text.contains("myapp_locks_acquire_attempts_total 2"), "{text}");
    /// assert!(text.contains("myapp_locks_acquire_success_total 1"), "{text}");
    /// assert!(text.contains(r#"myapp_locks_acquire_failures_total{reason="contention"} 1"#));
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Default options for every lock made from here (each [`LockBuilder`] starts from a copy and
    /// its setters change only that copy). They are checked when a lock is acquired: defaults
    /// that cannot work make every `try_acquire` and `acquire` fail with
    /// [`Error::InvalidOption`](crate::Error::InvalidOption).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, Error, LockOptions, Locks};
    /// use std::time::Duration;
    /// let mut defaults = LockOptions::default();
    /// defaults.ttl = Duration::from_secs(10);
    /// let locks = Locks::new(MemoryStore::new()).with_defaults(defaults.clone());
    /// assert_eq!(locks.lock("k")?.current_options(), &defaults);
    /// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
    /// assert_eq!(guard.record().ttl_ms, 10_000);
    /// defaults.ttl = Duration::ZERO;
    /// let broken = locks.clone().with_defaults(defaults);
    /// let refused = broken.lock("other")?.try_acquire().await;
    /// assert!(matches!(refused, Err(Error::InvalidOption { name: "ttl", .. })));
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn with_defaults(mut self, defaults: LockOptions) -> Self {
        self.defaults = defaults;
        self
    }

    /// The store, wrapped in [`crate::traced::Traced`]: for what the lock API does not do
    /// (inspect, list, force-release, cleanup).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, Inspection, Locks};
    /// let locks = Locks::new(MemoryStore::new());
    /// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
    /// let Some(Inspection::Record(r)) = locks.store().inspect(guard.key()).await? else {
    ///     panic!("no record")
    /// };
    /// assert_eq!((r.fence, r.token.as_deref()), (guard.fence(), Some(guard.token())));
    /// assert_eq!(locks.store().describe(), "memory://");
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn store(&self) -> &Arc<dyn LockStore> {
        &self.store
    }

    /// This process's holder id (see [`Locks::new`] for an example).
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// Releases every lease held through this `Locks` (and its clones) — the graceful-shutdown
    /// step: call it on SIGTERM after stopping the work. Guards released this way answer
    /// [`Released::AlreadyReleased`] later. Returns how many leases were still ours.
    ///
    /// It also ends local handoff for this `Locks` (it keeps working otherwise): a lease a task
    /// releases from then on goes back to the store, and a lease that was being handed to the
    /// next task of the process when it was called is released once that task holds it (or in
    /// the store, if the task gave up), waiting up to 5 s for that.
    ///
    /// # Errors
    /// The first store error; every lease is attempted regardless.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let a = locks.lock("a")?.acquire().await?;
    /// let b = locks.lock("b")?.acquire().await?;
    /// assert_eq!(locks.held(), 2);
    /// assert_eq!(locks.release_all().await?, 2);
    /// assert_eq!(a.release().await?, leasehold::Released::AlreadyReleased);
    /// # drop(b); Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn release_all(&self) -> Result<usize> {
        use futures_util::StreamExt;
        let mut released = 0;
        let mut first_err = None;
        // No more local handoff: a lease released from now on goes back to the store.
        self.live.close();
        let deadline = Instant::now() + RELEASE_ALL_SETTLE;
        loop {
            // Concurrently (pipelined on stores that multiplex), so shutting down with thousands
            // of leases takes a few round trips, not one per lease.
            let mut outcomes = futures_util::stream::iter(self.live.snapshot())
                .map(|shared| async move { shared.release().await })
                .buffer_unordered(RELEASE_ALL_IN_FLIGHT);
            while let Some(outcome) = outcomes.next().await {
                match outcome {
                    Ok(Released::Released) => released += 1,
                    Ok(_) => {}
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            // A lease handed on just before is on its way to the next task's guard (then
            // released by the next round) or back to the store.
            if !self.live.in_transit() || !self.live.settle(deadline).await {
                break;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    /// How many tasks of this process wait in the local layer for `key` right now (0 without the
    /// local layer). A lease released while tasks wait goes to the first of them without a store
    /// call, as long as its reserved fences last and no other process asked for it.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let key = leasehold::Key::new("k")?;
    /// let g = locks.lock_key(key.clone()).acquire().await?;
    /// let next = tokio::spawn({
    ///     let locks = locks.clone();
    ///     let key = key.clone();
    ///     async move { locks.lock_key(key).acquire().await }
    /// });
    /// while locks.queued(&key) == 0 {
    ///     tokio::task::yield_now().await;
    /// }
    /// g.release().await?;
    /// next.await.expect("task")?.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn queued(&self, key: &Key) -> usize {
        self.local.as_ref().map_or(0, |l| l.queued(key.as_str()))
    }

    /// How many leases are held through this `Locks` (and its clones) right now: a guard counts
    /// until it is released or dropped, even after its lease was lost.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let a = locks.lock("a")?.try_acquire().await?.expect("free");
    /// let b = locks.clone().lock("b")?.try_acquire().await?.expect("free");
    /// assert_eq!(locks.held(), 2);
    /// a.release().await?;
    /// drop(b);
    /// assert_eq!(locks.held(), 0);
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn held(&self) -> usize {
        self.live.len()
    }

    /// A lock on `key` with the default options.
    ///
    /// # Errors
    /// [`Error::InvalidKey`](crate::Error::InvalidKey) for a key [`Key::new`] refuses.
    ///
    /// ```
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// assert!(locks.lock("user:alice").is_ok());
    /// assert!(locks.lock("../x").is_ok()); // each store names its records safely
    /// assert!(matches!(locks.lock(""), Err(leasehold::Error::InvalidKey { .. })));
    /// assert!(matches!(locks.lock("a\0b"), Err(leasehold::Error::InvalidKey { .. })));
    /// ```
    pub fn lock(&self, key: impl AsRef<str>) -> Result<LockBuilder> {
        Ok(self.lock_key(Key::new(key)?))
    }

    /// A lock on an already validated key: like [`lock`](Self::lock), without the validation
    /// (so it cannot fail).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let key = leasehold::Key::new("user:alice")?;
    /// let guard = locks.lock_key(key.clone()).try_acquire().await?.expect("free");
    /// assert_eq!(guard.key(), &key);
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn lock_key(&self, key: Key) -> LockBuilder {
        LockBuilder::new(self.clone(), key, self.defaults.clone())
    }

    /// A permit of the semaphore `key` of `permits` permits (1 ..= [`crate::PERMIT_LIMIT`]): at
    /// most `permits` holders at once, across processes and hosts. It is built and held like a
    /// lock (TTL, wait, labels; the guard renews it, and `lost()`, `must_stop()` and
    /// `handoff_requested()` work as for a lock, the last firing when somebody waits for a
    /// permit), and each permit has its own fence, above every fence the key issued before.
    /// Waiters are served in arrival order. The local layer is not used.
    ///
    /// # Errors
    /// [`Error::InvalidKey`](crate::Error::InvalidKey) for a key [`Key::new`] refuses. Acquiring
    /// fails with [`Error::InvalidOption`](crate::Error::InvalidOption) `permits` for a count out
    /// of range, or when the key is held or waited for as something else (a lock, another
    /// count); with [`Error::NotSupported`](crate::Error::NotSupported) on a store without
    /// [`Capabilities::permits`](crate::Capabilities::permits).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, Error, Locks};
    /// let locks = Locks::new(MemoryStore::new());
    /// let a = locks.semaphore("render-slots", 2)?.acquire().await?;
    /// let b = locks.semaphore("render-slots", 2)?.acquire().await?;
    /// assert!(b.fence() > a.fence());
    /// assert!(locks.semaphore("render-slots", 2)?.try_acquire().await?.is_none(), "both held");
    /// let other_count = locks.semaphore("render-slots", 3)?.try_acquire().await;
    /// assert!(matches!(other_count, Err(Error::InvalidOption { name: "permits", .. })));
    /// a.release().await?;
    /// let c = locks.semaphore("render-slots", 2)?.acquire().await?;
    /// assert!(c.fence() > b.fence());
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn semaphore(&self, key: impl AsRef<str>, permits: u32) -> Result<LockBuilder> {
        Ok(self.lock(key)?.permit(PermitRequest::Semaphore { permits }))
    }

    /// The read-write lock `key`: [`read`](ReadWrite::read) for a read permit (shared with
    /// other readers, at most [`crate::PERMIT_LIMIT`]), [`write`](ReadWrite::write) for the
    /// write permit (alone). A waiting writer is not overtaken by readers that come after it,
    /// and fences rise across reads and writes, so a resource can refuse a writer older than a
    /// read it served. Errors as for [`semaphore`](Self::semaphore).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, Locks};
    /// let locks = Locks::new(MemoryStore::new());
    /// let catalog = locks.read_write("catalog")?;
    /// let r1 = catalog.read().acquire().await?;
    /// let r2 = catalog.read().acquire().await?;
    /// assert!(catalog.write().try_acquire().await?.is_none(), "readers hold it");
    /// r1.release().await?;
    /// r2.release().await?;
    /// let w = catalog.write().acquire().await?;
    /// assert!(catalog.read().try_acquire().await?.is_none(), "the writer holds it");
    /// # w.release().await?; Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn read_write(&self, key: impl AsRef<str>) -> Result<ReadWrite> {
        Ok(ReadWrite {
            locks: self.clone(),
            key: Key::new(key)?,
        })
    }
}

/// A read-write lock ([`Locks::read_write`]): builds read and write permits of one key.
#[derive(Debug, Clone)]
pub struct ReadWrite {
    locks: Locks,
    key: Key,
}

impl ReadWrite {
    /// A read permit: shared with other readers, not with a writer, and not granted while a
    /// writer waits ahead of it. See [`Locks::read_write`].
    pub fn read(&self) -> LockBuilder {
        self.locks
            .lock_key(self.key.clone())
            .permit(PermitRequest::Read)
    }

    /// The write permit: alone on the key. See [`Locks::read_write`].
    pub fn write(&self) -> LockBuilder {
        self.locks
            .lock_key(self.key.clone())
            .permit(PermitRequest::Write)
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }
}
