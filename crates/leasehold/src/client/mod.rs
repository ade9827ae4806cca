//! The user's entry point: [`Locks`] over a store, [`LockBuilder`] per key.

use crate::error::{Error, Result};
use crate::guard::{Grant, LeaseGuard, LiveSet, Released};
use crate::holder::HolderId;
use crate::key::Key;
use crate::local::{LocalGuard, LocalLocks};
use crate::metrics::Metrics;
use crate::options::{Backoff, LockOptions, Wait};
use crate::record::now_ms;
use crate::store::{AcquireOutcome, AcquireRequest, GiveUp, LockStore};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How many releases `release_all` runs at once.
const RELEASE_ALL_IN_FLIGHT: usize = 256;
/// How long `release_all` waits for leases being handed between tasks to land.
const RELEASE_ALL_SETTLE: Duration = Duration::from_secs(5);

/// The most fences one store acquisition reserves for the tasks of this process queued on a key
/// (so the most local handoffs before the lease goes back to the store, where other processes'
/// waiters get their turn).
const MAX_BLOCK: usize = 64;

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
    /// use leasehold::{memory::MemoryStore, HolderId, Locks};
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
    /// use leasehold::{memory::MemoryStore, HolderId, Locks, LockStore};
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
    /// use leasehold::{memory::MemoryStore, HolderId, Locks};
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
    /// use leasehold::{memory::MemoryStore, Locks};
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
    /// use leasehold::{memory::MemoryStore, Locks, Metrics};
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
    /// [`Error::InvalidOption`].
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, Error, LockOptions, Locks};
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
    /// use leasehold::{memory::MemoryStore, Inspection, Locks};
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
    /// [`Error::InvalidKey`] for a key [`Key::new`] refuses.
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
        LockBuilder {
            locks: self.clone(),
            key,
            opts: self.defaults.clone(),
        }
    }
}

/// One lock's options, then [`try_acquire`](LockBuilder::try_acquire) or
/// [`acquire`](LockBuilder::acquire). It starts from the [`Locks`]' defaults
/// ([`Locks::with_defaults`]); the setters only record values, which are checked
/// ([`LockOptions::validate`]) when the lock is acquired.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, Error, Locks};
/// use std::time::Duration;
/// let locks = Locks::new(MemoryStore::new());
/// let lock = locks.lock("k")?.ttl(Duration::from_secs(2)).renew_every(Duration::from_secs(2));
/// assert_eq!(lock.current_options().ttl, Duration::from_secs(2)); // recorded as given
/// let refused = lock.try_acquire().await; // no room to renew before expiry
/// assert!(matches!(refused, Err(Error::InvalidOption { name: "renew_every", .. })));
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
#[must_use = "a lock builder does nothing until acquired"]
pub struct LockBuilder {
    locks: Locks,
    key: Key,
    opts: LockOptions,
}

impl LockBuilder {
    /// Time to live (default 30 s), from 10 ms to one year. A holder that stops renewing loses the
    /// lease after it, and another holder can then take the lease over. A TTL out of range makes
    /// the acquisition fail with [`Error::InvalidOption`].
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::time::Duration;
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let guard = locks.lock("k")?.ttl(Duration::from_secs(2)).acquire().await?;
    /// assert_eq!(guard.record().ttl_ms, 2_000);
    /// guard.release().await?;
    /// assert!(locks.lock("k")?.ttl(Duration::from_millis(1)).acquire().await.is_err());
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.opts.ttl = ttl;
        self
    }

    /// Renewal period (default TTL/3); also how often the guard learns that a waiter asked for
    /// the lease. It must be above zero and leave the drift margin ([`LockOptions::drift`]) before
    /// the TTL, else the acquisition fails with [`Error::InvalidOption`] (see the example on
    /// [`LockBuilder`]).
    pub fn renew_every(mut self, period: Duration) -> Self {
        self.opts.renew_every = Some(period);
        self
    }

    /// Whether the guard renews by itself (default true). Without renewal the lease lives one TTL:
    /// the guard's [`lost`](LeaseGuard::lost) then completes with [`LostReason::Expired`] once the
    /// TTL minus the drift margin has passed.
    ///
    /// [`LostReason::Expired`]: crate::LostReason::Expired
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, Locks, LostReason};
    /// use std::time::Duration;
    /// let locks = Locks::new(MemoryStore::new());
    /// let lock = locks.lock("k")?.ttl(Duration::from_millis(100)).auto_renew(false);
    /// let guard = lock.try_acquire().await?.expect("free");
    /// assert_eq!(guard.lost().await, LostReason::Expired);
    /// assert!(!guard.is_current());
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.opts.auto_renew = on;
        self
    }

    /// Waits at most `limit` in [`acquire`](Self::acquire), which then fails with
    /// [`Error::Timeout`] naming the holder it saw last. Shorthand for
    /// `wait_policy(Wait::For(limit))`; [`try_acquire`](Self::try_acquire) ignores it.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, Error, HolderId, Locks};
    /// use std::time::Duration;
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    /// let b = Locks::from_arc(store).with_holder(HolderId::new("b"));
    /// let held = a.lock("k")?.try_acquire().await?.expect("free");
    /// match b.lock("k")?.wait(Duration::from_millis(20)).acquire().await {
    ///     Err(Error::Timeout { holder, waited, .. }) => {
    ///         assert_eq!(holder, "a");
    ///         assert!(waited >= Duration::from_millis(20));
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # held.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn wait(mut self, limit: Duration) -> Self {
        self.opts.wait = Wait::For(limit);
        self
    }

    /// Sets the wait policy (default [`Wait::Forever`]); see [`Wait`] for an example with
    /// [`Wait::No`].
    pub fn wait_policy(mut self, wait: Wait) -> Self {
        self.opts.wait = wait;
        self
    }

    /// Backoff between attempts while waiting (with change notifications only as a safety net),
    /// and between retries of a renewal that failed with a retryable error. It needs
    /// `0 < initial ≤ max`, else the acquisition fails with [`Error::InvalidOption`].
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{Backoff, Error, Locks};
    /// use std::time::Duration;
    /// let locks = Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let fast = Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(50) };
    /// locks.lock("k")?.backoff(fast).acquire().await?.release().await?;
    /// let broken = Backoff { initial: Duration::ZERO, ..fast };
    /// let refused = locks.lock("k")?.backoff(broken).acquire().await;
    /// assert!(matches!(refused, Err(Error::InvalidOption { name: "backoff", .. })));
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.opts.backoff = backoff;
        self
    }

    /// Whether waiting registers as waiter (default true). A registered waiter makes the
    /// holder's [`handoff_requested`](LeaseGuard::handoff_requested) fire, and once the lease is
    /// freed it is reserved for that waiter (for its [`waiter_ttl`](Self::waiter_ttl)): other
    /// contenders are refused meanwhile. Unregistered waiters just retry. A registration is
    /// withdrawn when the wait ends without the lease.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, HolderId, Inspection, Key, Locks, LockStore};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let who = |id: &str| Locks::from_arc(store.clone()).with_holder(HolderId::new(id));
    /// let (a, b, c, key) = (who("a"), who("b"), who("c"), Key::new("k")?);
    /// let held = a.lock_key(key.clone()).acquire().await?;
    /// let waiter = tokio::spawn(async move { b.lock("k")?.acquire().await });
    /// let registered = |i: Option<Inspection>| {
    ///     matches!(i, Some(Inspection::Record(r)) if r.waiter.is_some())
    /// };
    /// while !registered(store.inspect(&key).await?) {
    ///     tokio::task::yield_now().await;
    /// }
    /// held.release().await?;
    /// assert!(c.lock_key(key).try_acquire().await?.is_none(), "reserved for b");
    /// assert_eq!(waiter.await.expect("task")?.record().holder.as_deref(), Some("b"));
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn register_waiter(mut self, on: bool) -> Self {
        self.opts.register_waiter = on;
        self
    }

    /// Waiter registration lifetime (default `min(ttl, 5 s)`, at least 10 ms else the acquisition
    /// fails with [`Error::InvalidOption`]). A waiting `acquire` tries again at least every third
    /// of it, renewing its registration as it goes; a waiter that went away without withdrawing
    /// (a crashed process) stops reserving the lease once it lapses.
    pub fn waiter_ttl(mut self, ttl: Duration) -> Self {
        self.opts.waiter_ttl = Some(ttl);
        self
    }

    /// Adds a label stored with the lease (task id, purpose …); a second label of the same name
    /// replaces the first.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let lock = locks.lock("k")?.label("task", "41").label("task", "42").label("by", "cron");
    /// let guard = lock.acquire().await?;
    /// assert_eq!(guard.record().labels["task"], "42");
    /// assert_eq!(guard.record().labels.len(), 2);
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.opts.labels.insert(name.into(), value.into());
        self
    }

    /// Replaces all options: the [`Locks`]' defaults and whatever was set so far (labels
    /// included) no longer apply.
    ///
    /// ```
    /// use leasehold::{memory::MemoryStore, LockOptions, Locks, Wait};
    /// let locks = Locks::new(MemoryStore::new());
    /// let mut opts = LockOptions::default();
    /// opts.wait = Wait::No;
    /// let lock = locks.lock("k")?.label("gone", "yes").options(opts.clone());
    /// assert_eq!(lock.current_options(), &opts);
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn options(mut self, opts: LockOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The options in effect (see [`options`](Self::options) for an example).
    pub fn current_options(&self) -> &LockOptions {
        &self.opts
    }

    /// Takes the lease if it is free, without waiting.
    ///
    /// `Ok(None)` when another holder has it (or another task of this process holds the key).
    ///
    /// # Errors
    /// Invalid options, or a store failure.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while the store call is in flight, the call finishes in
    /// the background and a lease it granted is released at once ([`crate::settle`] waits for
    /// that before a process exits; outside a runtime, or if the release fails, the lease expires
    /// after its TTL).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, HolderId, Locks};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    /// let b = Locks::from_arc(store).with_holder(HolderId::new("b"));
    /// let held = a.lock("agent-7")?.try_acquire().await?.expect("free");
    /// // Another holder does not wait: `None` while `a` holds it.
    /// assert!(b.lock("agent-7")?.try_acquire().await?.is_none());
    /// held.release().await?;
    /// assert!(b.lock("agent-7")?.try_acquire().await?.is_some());
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn try_acquire(self) -> Result<Option<LeaseGuard>> {
        let mut me = self;
        me.opts.wait = Wait::No;
        match me.run().await {
            Ok(g) => Ok(Some(g)),
            Err(AcquireError::Held(_)) => Ok(None),
            Err(AcquireError::Failed(e)) => Err(e),
        }
    }

    /// Takes the lease, waiting for it up to the wait limit (default: no limit).
    ///
    /// Waiters wake on the store's change notification where it has one (inotify for files, a
    /// channel in memory), else poll with capped exponential backoff and jitter. While waiting the
    /// caller is registered as waiter (unless disabled): the holder's `handoff_requested()` fires and,
    /// once freed, the lease is reserved for this waiter.
    ///
    /// # Errors
    /// [`Error::Timeout`] naming the holder when the wait limit passes (or at once with
    /// [`Wait::No`]); invalid options; a store failure that is not retryable (retryable ones are
    /// retried until the limit, within a second of each other whatever the backoff: an attempt
    /// that failed may have spent the change notification that woke it).
    ///
    /// # The wait limit holds against a slow store
    /// With [`Wait::For`], `acquire` returns by the limit plus 100 ms even if the store stops
    /// answering (not the limit plus the store's own call timeout): the store's answers to the last
    /// attempt and to the withdrawal of the waiter registration are awaited until then, and after
    /// that left to finish in the background, where a lease granted too late is released at once
    /// and a registration withdrawn.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops waiting and leaves nothing taken. A waiter
    /// registration is withdrawn, and a store call in flight finishes in the background, where a
    /// lease it granted is released at once ([`crate::settle`] waits for both before a process
    /// exits; outside a runtime, or if the store does not answer, the registration lapses after its
    /// `waiter_ttl` and the lease expires after its TTL).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, Error, HolderId, Locks};
    /// use std::time::Duration;
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    /// let b = Locks::from_arc(store).with_holder(HolderId::new("b"));
    /// let held = a.lock("report")?.acquire().await?;
    /// let waited = b.lock("report")?.wait(Duration::from_millis(50)).acquire().await;
    /// assert!(matches!(waited, Err(Error::Timeout { .. })), "a holds it");
    /// // A waiter is woken by the release, not after the TTL.
    /// let next = tokio::spawn(async move {
    ///     b.lock("report")?.wait(Duration::from_secs(5)).acquire().await
    /// });
    /// held.release().await?;
    /// let mine = next.await.expect("task")?;
    /// assert!(mine.fence() > held.fence());
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn acquire(self) -> Result<LeaseGuard> {
        let key = self.key.clone();
        let started = Instant::now();
        match self.run().await {
            Ok(g) => Ok(g),
            Err(AcquireError::Held(holder)) => Err(Error::Timeout {
                key: key.to_string(),
                holder,
                waited: started.elapsed(),
            }),
            Err(AcquireError::Failed(e)) => Err(e),
        }
    }

    async fn run(self) -> std::result::Result<LeaseGuard, AcquireError> {
        self.opts.validate().map_err(AcquireError::Failed)?;
        let started = Instant::now();
        let metrics = self.locks.metrics.clone();
        if let Some(m) = &metrics {
            m.attempts.inc();
        }
        let result = self.run_inner(started).await;
        if let Some(m) = &metrics {
            m.acquire_seconds.observe(started.elapsed().as_secs_f64());
            match &result {
                Ok(_) => m.successes.inc(),
                Err(AcquireError::Held(_)) | Err(AcquireError::Failed(Error::Timeout { .. })) => {
                    m.failures.with_label_values(&["contention"]).inc()
                }
                Err(AcquireError::Failed(_)) => {
                    m.failures.with_label_values(&["store_error"]).inc()
                }
            }
        }
        result
    }

    async fn run_inner(self, started: Instant) -> std::result::Result<LeaseGuard, AcquireError> {
        let LockBuilder { locks, key, opts } = self;
        let deadline = match opts.wait {
            Wait::No => Some(started),
            Wait::For(d) => Some(started + d),
            Wait::Forever => None,
        };
        let waiting = opts.wait != Wait::No;
        let timeout = |holder: String| {
            AcquireError::Failed(Error::Timeout {
                key: key.to_string(),
                holder,
                waited: started.elapsed(),
            })
        };

        // Layer 1: queue behind this process's other tasks on the key.
        let local = match &locks.local {
            None => None,
            Some(l) if !waiting => Some(
                l.try_lock(key.as_str())
                    .ok_or_else(|| AcquireError::Held("another task of this process".into()))?,
            ),
            Some(l) => match deadline {
                None => Some(l.lock(key.as_str()).await),
                Some(d) => match tokio::time::timeout_at(d, l.lock(key.as_str())).await {
                    Ok(g) => Some(g),
                    Err(_) => return Err(timeout("another task of this process".into())),
                },
            },
        };

        // A lease the previous local holder handed on: ours without a store call if it fits.
        let mut local = local;
        if let Some(carry) = local.as_mut().and_then(LocalGuard::take_carry) {
            if carry.fits(locks.holder.as_str(), &opts) {
                tracing::debug!(key = %key, "lease taken over from a task of this process");
                return Ok(LeaseGuard::carried(
                    carry,
                    locks.metrics.clone(),
                    local,
                    locks.live.clone(),
                ));
            }
            carry.release().await;
        }

        let store = locks.store.clone();
        let mut req = AcquireRequest::new(key.clone(), locks.holder.as_str(), opts.ttl);
        req.labels = opts.labels.clone();
        if waiting && opts.register_waiter {
            req.waiter_ttl = Some(opts.waiter_lifetime());
        }
        // Subscribed to change notifications only once the key turns out to be held: a free key
        // costs no subscription (a round trip on Redis). The attempt after subscribing is made at
        // once, so no change between the first attempt and the subscription is missed.
        let mut watch: Option<Box<dyn crate::store::ChangeWatch>> = None;
        let mut subscribed = false;
        // Subscribing failed: when to try again (polling meanwhile).
        let mut resubscribe_at: Option<Instant> = None;
        let mut attempt = 0u32;
        let mut registered = false;
        // Who held the key at the last answer, for the timeout's message.
        let mut last_holder: Option<String> = None;
        // A waiting acquire's store calls end by its wait limit and allowance (not a try: its
        // one call has the store's own timeout).
        let attempt_limit = match opts.wait {
            Wait::For(_) => deadline.map(|d| d + WAIT_ALLOWANCE),
            Wait::No | Wait::Forever => None,
        };
        // If this future is dropped while registered as waiter, withdraw in the background.
        let mut on_cancel = WithdrawOnDrop {
            store: Some(store.clone()),
            key: key.clone(),
            token: req.token.clone(),
            armed: false,
        };
        loop {
            // One fence for us and one for each task of this process queued behind us: the lease
            // is handed down that line before it goes back to the store.
            req.fences = 1 + local
                .as_ref()
                .map_or(0, |l| l.waiting().min(MAX_BLOCK - 1) as u64);
            let sent = Instant::now();
            // While the call is in flight, a drop of this future leaves it to the attempt, which
            // finishes it in the background and undoes what it did.
            on_cancel.armed = false;
            let call = Attempt::start(&store, req, registered);
            let (sent_req, res) = match attempt_limit {
                None => call.answer().await,
                Some(limit) => match tokio::time::timeout_at(limit, call.answer()).await {
                    Ok(answered) => answered,
                    Err(_) => {
                        // Dropped unanswered: it finishes in the background, undoing what it did.
                        return Err(timeout(last_holder.unwrap_or_else(|| {
                            "unknown (the store did not answer within the wait limit)".into()
                        })));
                    }
                },
            };
            req = sent_req;
            let failed = res.is_err();
            let (wait_hint, holder) = match res {
                Ok(AcquireOutcome::Granted(rec)) => {
                    on_cancel.armed = false;
                    tracing::debug!(key = %key, fence = rec.fence, "lease acquired");
                    return Ok(LeaseGuard::new(Grant {
                        store,
                        record: rec,
                        key,
                        token: req.token,
                        opts,
                        sent_at: sent,
                        metrics: locks.metrics.clone(),
                        local,
                        live: locks.live.clone(),
                        fences: req.fences,
                    }));
                }
                Ok(AcquireOutcome::Held(rec)) if !waiting => {
                    return Err(AcquireError::Held(holder_of(&rec, now_ms())));
                }
                Ok(AcquireOutcome::Held(rec)) => {
                    registered |= rec.waiter_token.as_deref() == Some(req.token.as_str());
                    let now = now_ms();
                    let who = holder_of(&rec, now);
                    // Wake no later than the holder's expiry (+1 ms) to take over a dead lease.
                    let hint = if rec.is_held(now) {
                        Some(rec.remaining(now) + Duration::from_millis(1))
                    } else {
                        None
                    };
                    (hint, who)
                }
                Err(e) if waiting && e.is_retryable() => {
                    tracing::debug!(key = %key, error = %e, "acquire failed; retrying");
                    (None, format!("unknown (store error: {e})"))
                }
                Err(e) => {
                    on_cancel.armed = false;
                    let until = attempt_limit.unwrap_or_else(|| Instant::now() + WAIT_ALLOWANCE);
                    withdraw_by(until, &store, &key, &req.token, registered).await;
                    return Err(AcquireError::Failed(e));
                }
            };
            on_cancel.armed = registered;
            let now = Instant::now();
            if let Some(d) = deadline.filter(|&d| now >= d) {
                on_cancel.armed = false;
                withdraw_by(d + WAIT_ALLOWANCE, &store, &key, &req.token, registered).await;
                return Err(timeout(holder));
            }
            last_holder = Some(holder);
            if watch.as_ref().is_some_and(|w| w.stale()) {
                // Its connection ended or its server stopped answering (a failover whose old
                // server hangs): subscribe again, where the store now is.
                tracing::debug!(key = %key, "change notification lost; subscribing again");
                watch = None;
                subscribed = false;
                req.watching = false;
            }
            if !subscribed {
                subscribed = true;
                // Within the wait limit, whatever the store does.
                let subscribing = store.subscribe(&key);
                let answer = match deadline {
                    Some(d) => tokio::time::timeout_at(d, subscribing).await.ok(),
                    None => Some(subscribing.await),
                };
                watch = match answer {
                    Some(Ok(w)) => w,
                    Some(Err(e)) => {
                        tracing::debug!(key = %key, error = %e, "no change notification; polling, and subscribing again in a while");
                        resubscribe_at = Some(Instant::now() + RESUBSCRIBE_EVERY);
                        None
                    }
                    None => None,
                };
                req.watching = watch.is_some();
                if watch.is_some() {
                    // Attempt again at once: a release between the last attempt and the
                    // subscription was not heard. Without a subscription there is nothing to
                    // miss, and the next attempt waits for the pause.
                    continue;
                }
            }
            let mut pause = opts.backoff.delay(attempt);
            if watch.is_some() {
                // With notifications the timer is only a safety net.
                pause = opts.backoff.max;
            }
            if let Some(h) = wait_hint {
                pause = pause.min(h);
            }
            if req.waiter_ttl.is_some() {
                pause = pause.min(opts.waiter_lifetime() / 3);
            }
            if let Some(at) = resubscribe_at {
                pause = pause.min(at.saturating_duration_since(now));
            }
            if failed {
                // The store failed to answer (a failover under way, say): its state is unknown,
                // and a change notification that woke this attempt is spent. Attempt again soon,
                // whatever the backoff, rather than sleep a long one for a notification that may
                // have come already.
                pause = pause.min(RETRY_AFTER_ERROR);
            }
            let mut until = now + pause;
            if let Some(d) = deadline {
                until = until.min(d);
            }
            match watch.as_mut() {
                Some(w) => {
                    tokio::select! {
                        _ = w.changed() => {}
                        _ = tokio::time::sleep_until(until) => { attempt = attempt.saturating_add(1); }
                    }
                }
                None => {
                    tokio::time::sleep_until(until).await;
                    attempt = attempt.saturating_add(1);
                }
            }
            if resubscribe_at.is_some_and(|at| Instant::now() >= at) {
                resubscribe_at = None;
                subscribed = false;
            }
        }
    }
}

/// Who keeps a held record from us, for messages: its live holder, or the waiter it is reserved
/// for.
fn holder_of(rec: &crate::record::LeaseRecord, now_ms: u64) -> String {
    match (&rec.holder, rec.is_held(now_ms)) {
        (Some(h), true) => h.clone(),
        _ => format!(
            "nobody (reserved for waiter {})",
            rec.waiter.clone().unwrap_or_default()
        ),
    }
}

/// Withdraws a waiter registration when a waiting `acquire` is dropped (cancelled).
struct WithdrawOnDrop {
    store: Option<Arc<dyn LockStore>>,
    key: Key,
    token: String,
    armed: bool,
}

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(store) = self.store.take() {
            let (key, token) = (self.key.clone(), std::mem::take(&mut self.token));
            crate::background::spawn_here(
                async move { withdraw(&*store, &key, &token, true).await },
            );
        }
    }
}

/// The longest pause of a waiting `acquire` after an attempt that failed with a retryable error.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

/// How often a waiting `acquire` whose change notification could not be made (or made again,
/// after its connection ended) tries to subscribe again; it polls by its backoff meanwhile.
const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(1);

/// How far past its wait limit a waiting `acquire` goes for the store's last answers (to its last
/// attempt, to the withdrawal of its waiter registration) before it returns and leaves them to
/// finish in the background.
const WAIT_ALLOWANCE: Duration = Duration::from_millis(100);

/// The answer of one store acquisition, with the store and request it was made with.
type Answered = (Arc<dyn LockStore>, AcquireRequest, Result<AcquireOutcome>);

/// One store acquisition in flight. Dropped before it answers (its caller's wait limit passed, or
/// the caller's future was dropped), the call goes on in the background, where a lease it granted
/// is released and a waiter registration (its own or an earlier attempt's, `registered`) is
/// withdrawn, so nothing stays taken for a caller that left. [`crate::settle`] waits for it.
struct Attempt {
    call: Pin<Box<dyn Future<Output = Answered> + Send>>,
    answered: bool,
    registered: bool,
    /// The request's flag, set when the attempt is dropped unanswered: a store retrying within
    /// the call (a lost compare-and-set race) stops instead of taking the key for nobody.
    given_up: GiveUp,
}

impl Attempt {
    fn start(store: &Arc<dyn LockStore>, req: AcquireRequest, registered: bool) -> Self {
        let store = store.clone();
        let given_up = req.given_up.clone();
        Attempt {
            given_up,
            call: Box::pin(async move {
                let res = store.acquire(&req).await;
                (store, req, res)
            }),
            answered: false,
            registered,
        }
    }

    /// The request back, and the store's answer. Cancel safe: a dropped wait drops the attempt,
    /// which leaves the call to the background.
    async fn answer(mut self) -> (AcquireRequest, Result<AcquireOutcome>) {
        let (_, req, res) = (&mut self.call).await;
        self.answered = true;
        (req, res)
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.given_up.give_up();
        // A zero-sized stand-in: no allocation.
        let call = std::mem::replace(&mut self.call, Box::pin(std::future::pending()));
        let registered = self.registered;
        crate::background::spawn_here(async move {
            let (store, req, res) = call.await;
            let (key, token) = (&req.key, req.token.as_str());
            match res {
                Ok(AcquireOutcome::Granted(_)) => {
                    tracing::debug!(key = %key, "releasing a lease granted to an acquisition that was given up");
                    if let Err(e) = store.release(key, token).await {
                        tracing::debug!(key = %key, error = %e, "could not release a lease granted to an acquisition that was given up; it expires with its TTL");
                    }
                }
                Ok(AcquireOutcome::Held(rec)) => {
                    let mine = rec.waiter_token.as_deref() == Some(token);
                    withdraw(&*store, key, token, registered || mine).await;
                }
                Err(_) => withdraw(&*store, key, token, registered).await,
            }
        });
    }
}

/// Withdraws a waiter registration, waiting for it until `until` at most (a slow store does not
/// stretch a wait limit): the withdrawal then goes on in the background.
async fn withdraw_by(
    until: Instant,
    store: &Arc<dyn LockStore>,
    key: &Key,
    token: &str,
    registered: bool,
) {
    if !registered {
        return;
    }
    let (store, key, token) = (store.clone(), key.clone(), token.to_owned());
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    crate::background::spawn_here(async move {
        withdraw(&*store, &key, &token, true).await;
        let _ = done.send(());
    });
    let _ = tokio::time::timeout_at(until, finished).await;
}

async fn withdraw(store: &dyn LockStore, key: &Key, token: &str, registered: bool) {
    if registered {
        if let Err(e) = store.withdraw_waiter(key, token).await {
            tracing::debug!(key = %key, error = %e, "could not withdraw waiter registration; it lapses");
        }
    }
}

enum AcquireError {
    /// Held elsewhere; by whom.
    Held(String),
    Failed(Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::LeaseRecord;
    use crate::store::{
        Capabilities, ChangeWatch, CleanupReport, Inspection, ReleaseOutcome, RenewOutcome,
    };
    use crate::stores::memory::MemoryStore;
    use crate::HolderId;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A memory store whose change notification cannot be made (a pub/sub connection refused)
    /// unless `notifies`, counting acquisitions and subscriptions; its next `fail_acquires`
    /// acquisitions fail with a retryable error.
    #[derive(Debug, Default)]
    struct NoNotifications {
        inner: MemoryStore,
        acquires: AtomicUsize,
        subscribes: AtomicUsize,
        notifies: bool,
        fail_acquires: AtomicUsize,
    }

    #[async_trait]
    impl LockStore for NoNotifications {
        fn describe(&self) -> String {
            "memory without notifications".into()
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
        async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
            self.acquires.fetch_add(1, Ordering::SeqCst);
            let fail = self
                .fail_acquires
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if fail {
                return Err(Error::Unavailable {
                    store: self.describe(),
                    detail: "no answer".into(),
                });
            }
            self.inner.acquire(req).await
        }
        async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
            self.inner.renew(key, token, ttl).await
        }
        async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
            self.inner.release(key, token).await
        }
        async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
            self.inner.withdraw_waiter(key, token).await
        }
        async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
            self.inner.inspect(key).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
            self.inner.list(prefix).await
        }
        async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
            self.inner.force_release(key).await
        }
        async fn cleanup(&self, older_than: Duration) -> Result<CleanupReport> {
            self.inner.cleanup(older_than).await
        }
        async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
            self.subscribes.fetch_add(1, Ordering::SeqCst);
            if self.notifies {
                return self.inner.subscribe(key).await;
            }
            Err(Error::Unavailable {
                store: self.describe(),
                detail: "no pub/sub connection".into(),
            })
        }
    }

    /// A waiter with long timers, woken by the release's notification, whose attempt then fails
    /// (the store in a failover, say): it attempts again within a second, not after its backoff,
    /// and gets the lease.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_woken_attempt_fails_attempts_again_within_a_second() {
        let store = Arc::new(NoNotifications {
            notifies: true,
            ..Default::default()
        });
        let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
        let b = Locks::from_arc(store.clone()).with_holder(HolderId::new("b"));
        let held = a
            .lock("k")
            .unwrap()
            .ttl(Duration::from_secs(600))
            .acquire()
            .await
            .unwrap();
        let long = Duration::from_secs(60);
        let waiter = tokio::spawn(async move {
            b.lock("k")
                .unwrap()
                .register_waiter(false)
                .backoff(Backoff {
                    initial: long,
                    max: long,
                })
                .wait(Duration::from_secs(300))
                .acquire()
                .await
        });
        // The waiter has attempted and subscribed.
        while store.subscribes.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        store.fail_acquires.store(1, Ordering::SeqCst);
        let released = tokio::time::Instant::now();
        held.release().await.unwrap();
        let got = waiter.await.unwrap().unwrap();
        assert!(
            released.elapsed() <= RETRY_AFTER_ERROR + Duration::from_millis(10),
            "{:?}",
            released.elapsed()
        );
        assert_eq!(
            store.fail_acquires.load(Ordering::SeqCst),
            0,
            "no attempt failed"
        );
        got.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_without_notifications_polls_and_subscribes_again_once_a_second() {
        let store = Arc::new(NoNotifications::default());
        let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
        let b = Locks::from_arc(store.clone()).with_holder(HolderId::new("b"));
        let held = a
            .lock("k")
            .unwrap()
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        let before = store.acquires.load(Ordering::SeqCst);
        let waited = b
            .lock("k")
            .unwrap()
            .wait(Duration::from_secs(10))
            .acquire()
            .await;
        assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
        let subscribes = store.subscribes.load(Ordering::SeqCst);
        let acquires = store.acquires.load(Ordering::SeqCst) - before;
        // One subscription at first, then one a second: not one per poll.
        assert!(
            (9..=12).contains(&subscribes),
            "{subscribes} subscriptions in 10 s"
        );
        // Polls by the backoff (at most 500 ms, jittered down to 250 ms) and nothing more: a
        // failed subscription is not followed by an attempt of its own.
        assert!(
            (20..=50).contains(&acquires),
            "{acquires} acquisitions in 10 s"
        );
        held.release().await.unwrap();
    }
}
