//! [`LockBuilder`]: one lock's options, then `try_acquire` or `acquire` (which run the
//! acquisition in `acquire.rs`).

use super::acquire::{self, AcquireError};
use super::Locks;
use crate::error::{Error, Result};
use crate::guard::LeaseGuard;
use crate::key::Key;
use crate::options::{Backoff, LockOptions, Wait};
use crate::store::PermitRequest;
use std::time::Duration;
use tokio::time::Instant;

/// One lock's options, then [`try_acquire`](LockBuilder::try_acquire) or
/// [`acquire`](LockBuilder::acquire). It starts from the [`Locks`]' defaults
/// ([`Locks::with_defaults`]); the setters only record values, which are checked
/// ([`LockOptions::validate`]) when the lock is acquired.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{stores::memory::MemoryStore, Error, Locks};
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
    /// A permit of a semaphore or read-write lock instead of the key's lock.
    permit: Option<PermitRequest>,
}

impl LockBuilder {
    /// A lock on `key` through `locks`, starting from `opts`.
    pub(super) fn new(locks: Locks, key: Key, opts: LockOptions) -> Self {
        LockBuilder {
            locks,
            key,
            opts,
            permit: None,
        }
    }

    /// The same, for a permit.
    pub(super) fn permit(mut self, permit: PermitRequest) -> Self {
        self.permit = Some(permit);
        self
    }

    /// The permit this builder takes, `None` for a lock.
    ///
    /// ```
    /// use leasehold::{memory::MemoryStore, Locks, PermitRequest};
    /// let locks = Locks::new(MemoryStore::new());
    /// assert_eq!(locks.lock("k")?.current_permit(), None);
    /// let slots = locks.semaphore("slots", 4)?;
    /// assert_eq!(slots.current_permit(), Some(PermitRequest::Semaphore { permits: 4 }));
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn current_permit(&self) -> Option<PermitRequest> {
        self.permit
    }

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

    /// How long before the lease could expire the guard's
    /// [`must_stop`](LeaseGuard::must_stop) fires when renewals have not succeeded (default
    /// [`LockOptions::loss_grace_period`]'s rule: 9.849 s at a 30 s TTL). Give it the time
    /// whatever acts under the lease needs to stop, SIGKILL included. It must satisfy
    /// `renew period + loss grace + drift < ttl` ([`LockOptions::max_loss_grace`]), else the
    /// acquisition fails with [`Error::InvalidOption`].
    pub fn loss_grace(mut self, grace: Duration) -> Self {
        self.opts.loss_grace = Some(grace);
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
    /// use leasehold::{stores::memory::MemoryStore, Locks, LostReason};
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
    /// use leasehold::{stores::memory::MemoryStore, Error, HolderId, Locks};
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
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Inspection, Key, Locks, LockStore};
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
    /// use leasehold::{stores::memory::MemoryStore, LockOptions, Locks, Wait};
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
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Locks};
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
        match acquire::run(me.locks, me.key, me.opts, me.permit).await {
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
    /// use leasehold::{stores::memory::MemoryStore, Error, HolderId, Locks};
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
        match acquire::run(self.locks, self.key, self.opts, self.permit).await {
            Ok(g) => Ok(g),
            Err(AcquireError::Held(holder)) => Err(Error::Timeout {
                key: key.to_string(),
                holder,
                waited: started.elapsed(),
            }),
            Err(AcquireError::Failed(e)) => Err(e),
        }
    }
}
