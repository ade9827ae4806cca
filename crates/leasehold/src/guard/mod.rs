//! The held lease: [`LeaseGuard`], what its release found ([`Released`]), and the guards alive
//! under one [`crate::Locks`]. Their renewals are scheduled by the renewal wheel (`wheel.rs`).

use crate::carry::{Carry, InTransit, Transit};
use crate::error::Result;
use crate::key::Key;
use crate::local::LocalGuard;
use crate::metrics::Metrics;
use crate::options::LockOptions;
use crate::record::{now_ms, LeaseRecord};
use crate::store::{LockStore, LostReason, ReleaseOutcome};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

mod stop;
#[cfg(test)]
mod tests;
mod wheel;

pub use stop::StopReason;
use wheel::{aligned, Renewals};

/// What [`LeaseGuard::release`] found.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{stores::memory::MemoryStore, Locks, LostReason, Released};
/// let locks = Locks::new(MemoryStore::new());
/// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
/// locks.store().force_release(guard.key()).await?; // an operator frees it
/// assert_eq!(guard.release().await?, Released::Lost(LostReason::Released));
/// assert_eq!(guard.release().await?, Released::AlreadyReleased);
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// The lease was ours and is free now.
    Released,
    /// An earlier `release` (or [`crate::Locks::release_all`]) already freed it; release is
    /// idempotent.
    AlreadyReleased,
    /// The lease was no longer ours when we released it.
    Lost(LostReason),
}

#[derive(Debug, Clone)]
struct State {
    lost: Option<LostReason>,
    handoff: Option<String>,
    released: bool,
    /// The lease is surely ours until then (local monotonic clock, drift subtracted).
    valid_until: Instant,
}

/// A value whose changes can be awaited: a guard's [`State`], for `lost()` and
/// `handoff_requested()`. Lighter than `tokio::sync::watch`, whose creation, every change and drop
/// each notify wait lists (eight of them per change and per drop) whether or not anyone waits:
/// measurable at tens of thousands of guards a second.
#[derive(Debug)]
struct Watched<T> {
    value: Mutex<T>,
    changed: Notify,
}

impl<T> Watched<T> {
    fn new(value: T) -> Self {
        Watched {
            value: Mutex::new(value),
            changed: Notify::new(),
        }
    }

    /// The value, locked (never held across an await).
    fn borrow(&self) -> parking_lot::MutexGuard<'_, T> {
        self.value.lock()
    }

    /// Changes the value with `f`; when it says it modified the value, wakes the waiters.
    fn send_if_modified(&self, f: impl FnOnce(&mut T) -> bool) -> bool {
        let modified = f(&mut self.value.lock());
        if modified {
            self.changed.notify_waiters();
        }
        modified
    }

    /// A change notification, registered before it returns: take it, then look at the value,
    /// then await it, and no change after the look is missed.
    fn changed(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut n = Box::pin(self.changed.notified());
        n.as_mut().enable();
        n
    }
}

/// The guards alive under one [`crate::Locks`], for `release_all`, and their renewal schedule.
#[derive(Debug, Default)]
pub(crate) struct LiveSet {
    next: AtomicU64,
    guards: Mutex<HashMap<u64, Weak<Shared>>>,
    renewals: Arc<Renewals>,
    /// Set by `release_all`: leases are no longer handed on between tasks.
    closing: AtomicBool,
    /// Leases handed on and not yet taken by the next task (or released, if nobody took them).
    transit: Arc<InTransit>,
}

impl LiveSet {
    pub(crate) fn snapshot(&self) -> Vec<Arc<Shared>> {
        self.guards
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.guards.lock().len()
    }

    /// Stops handing leases on between tasks (for good).
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Whether a handed-on lease is in transit.
    pub(crate) fn in_transit(&self) -> bool {
        self.transit.any()
    }

    /// Waits until no handed-on lease is in transit, or `deadline`; whether none is.
    pub(crate) async fn settle(&self, deadline: Instant) -> bool {
        self.transit.settle(deadline).await
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    store: Arc<dyn LockStore>,
    key: Key,
    token: String,
    record: LeaseRecord,
    /// This acquisition's fence, and the last fence of the block reserved with the store lease
    /// (handed on to this process's next tasks on the key).
    fence: u64,
    block_end: u64,
    opts: LockOptions,
    state: Watched<State>,
    metrics: Option<Metrics>,
    acquired_at: Instant,
    /// The renewal in flight, if any.
    renewer: Mutex<Option<AbortHandle>>,
    /// When the next renewal is scheduled, if it is.
    scheduled: Mutex<Option<Instant>>,
    /// The scheduler; held by every guard, so leases keep renewing after their `Locks` is dropped.
    renewals: Arc<Renewals>,
    live: Weak<LiveSet>,
    id: u64,
    /// The runtime the lease was granted under: a guard dropped outside any runtime (on a plain
    /// thread, by another language's garbage collector) releases on it.
    runtime: Option<tokio::runtime::Handle>,
}

impl Shared {
    fn mark_lost(&self, reason: LostReason) {
        let mut fired = false;
        self.state.send_if_modified(|s| {
            if s.lost.is_none() && !s.released {
                tracing::warn!(key = %self.key, fence = self.fence, %reason, "lease lost");
                s.lost = Some(reason.clone());
                fired = true;
                true
            } else {
                false
            }
        });
        if fired {
            if let Some(m) = &self.metrics {
                m.lost.inc();
                m.hold_seconds
                    .observe(self.acquired_at.elapsed().as_secs_f64());
            }
        }
    }

    /// Marks the lease released; `Some(prior loss)` the first time, `None` afterwards.
    fn begin_release(&self) -> Option<Option<LostReason>> {
        let mut first = None;
        self.state.send_if_modified(|s| {
            if s.released {
                return false;
            }
            s.released = true;
            first = Some(s.lost.clone());
            true
        });
        if first.is_some() {
            if let Some(h) = self.renewer.lock().take() {
                h.abort();
            }
            self.renewals.cancel(self);
            if let Some(live) = self.live.upgrade() {
                live.guards.lock().remove(&self.id);
            }
        }
        first
    }

    /// Releases in the store (once); later calls answer `AlreadyReleased`.
    pub(crate) async fn release(&self) -> Result<Released> {
        match self.begin_release() {
            None => Ok(Released::AlreadyReleased),
            Some(prior) => self.release_in_store(prior).await,
        }
    }

    /// Why the store no longer had our lease (best effort: one read).
    async fn why_not_held(&self) -> LostReason {
        match self.store.inspect(&self.key).await {
            Ok(Some(crate::store::Inspection::Record(r))) => {
                crate::decide::lost_reason(Some(&r), &self.token, now_ms())
                    .unwrap_or(LostReason::Expired)
            }
            Ok(None) => LostReason::Released,
            _ => LostReason::Expired,
        }
    }

    async fn release_in_store(&self, prior_loss: Option<LostReason>) -> Result<Released> {
        let outcome = self.store.release(&self.key, &self.token).await?;
        if let Some(m) = &self.metrics {
            m.releases.inc();
            if prior_loss.is_none() {
                m.hold_seconds
                    .observe(self.acquired_at.elapsed().as_secs_f64());
            }
        }
        Ok(match (outcome, prior_loss) {
            (_, Some(reason)) => Released::Lost(reason),
            (ReleaseOutcome::Released, None) => Released::Released,
            (ReleaseOutcome::NotHeld, None) => Released::Lost(self.why_not_held().await),
        })
    }
}

/// A held lease. Renews itself (unless disabled), tells when it is lost or wanted, and releases on
/// [`release`](LeaseGuard::release) or, in the background, on drop.
///
/// # Expiry
/// The guard renews every `renew_every` (default TTL/3). If renewal is refused (the lease was taken
/// over, force-released or has expired), fails with an error retrying cannot heal (not
/// [`Error::is_retryable`](crate::Error::is_retryable): at once), or keeps failing until the lease
/// could have expired (`acquired/renewed + TTL − drift` on this process's monotonic clock,
/// measured from when the request was *sent*), [`lost`](LeaseGuard::lost) fires and renewal
/// stops: it fires before another holder could be granted the lease, as long as clocks drift less
/// than the drift margin.
///
/// `lost` is the last moment. Whatever acts under the lease must be *gone* by then, so the guard
/// tells it earlier: [`must_stop`](LeaseGuard::must_stop) fires at the stop-by deadline, the
/// loss grace ([`LockOptions::loss_grace`]) before `valid_until`, when renewals have not moved it,
/// and at once when the store says the lease is gone:
///
/// ```text
/// sent ─ granted ─ renew ─ renew ✗ ─ renew ✗ ─ … ─ stop-by ──────────── valid_until ─ drift ─ another may be granted
///                                                  │◄─── loss grace ───►│
/// valid_until = sent(last successful renewal) + ttl − drift      (local monotonic clock)
/// stop-by     = valid_until − loss grace                          (must_stop() fires)
/// renew period + loss grace + drift < ttl                         (LockOptions::validate)
/// ```
///
/// # Drop
/// Dropping an unreleased guard releases the lease in the background: on the current tokio
/// runtime, or, dropped outside one (on a plain thread), on the runtime it was granted under.
/// [`crate::settle`] waits for that release. If that runtime has shut down, the lease expires
/// after its TTL — on the file store at once when the process exits, through the kernel lock.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{stores::memory::MemoryStore, Locks};
/// let locks = Locks::new(MemoryStore::new());
/// let guard = locks.lock("report")?.acquire().await?;
/// let fence = guard.fence(); // pass it to the resource you write to
/// tokio::select! {
///     _ = guard.lost() => { /* stop writing */ }
///     _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => { /* work done */ }
/// }
/// assert_eq!(guard.release().await?, leasehold::Released::Released);
/// assert_eq!(guard.release().await?, leasehold::Released::AlreadyReleased);
/// # let _ = fence; Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[must_use = "the lease is released when the guard is dropped"]
pub struct LeaseGuard {
    shared: Arc<Shared>,
    local: Mutex<Option<LocalGuard>>,
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", &self.shared.key)
            .field("fence", &self.shared.fence)
            .field("current", &self.is_current())
            .finish()
    }
}

/// What a new guard is made of.
pub(crate) struct Grant {
    pub(crate) store: Arc<dyn LockStore>,
    pub(crate) record: LeaseRecord,
    pub(crate) key: Key,
    pub(crate) token: String,
    pub(crate) opts: LockOptions,
    pub(crate) sent_at: Instant,
    pub(crate) metrics: Option<Metrics>,
    pub(crate) local: Option<LocalGuard>,
    pub(crate) live: Arc<LiveSet>,
    /// How many fences the store reserved (the record's fence is the last).
    pub(crate) fences: u64,
}

/// What [`LeaseGuard::build`] makes a guard of.
struct Parts {
    store: Arc<dyn LockStore>,
    key: Key,
    token: String,
    record: LeaseRecord,
    fence: u64,
    block_end: u64,
    opts: LockOptions,
    valid_until: Instant,
    handoff: Option<String>,
    renew_at: Option<Instant>,
    metrics: Option<Metrics>,
    local: Option<LocalGuard>,
    live: Arc<LiveSet>,
    /// The runtime the lease was granted under, when not the current one.
    runtime: Option<tokio::runtime::Handle>,
}

impl LeaseGuard {
    pub(crate) fn new(g: Grant) -> Self {
        let valid_until = g.sent_at + g.opts.ttl.saturating_sub(g.opts.drift());
        // The store reserved `fences` fences ending at the record's; at u64::MAX a block cannot
        // be trusted to lie above earlier fences, so it is not handed on (a block of one).
        let (fence, block_end) = match g.record.fence {
            u64::MAX => (u64::MAX, u64::MAX),
            end => (end.saturating_sub(g.fences.max(1) - 1), end),
        };
        let first_renewal = g.opts.auto_renew.then(|| {
            let period = g.opts.renew_period();
            aligned(g.sent_at + period, period)
        });
        Self::build(Parts {
            store: g.store,
            key: g.key,
            token: g.token,
            record: g.record,
            fence,
            block_end,
            opts: g.opts,
            valid_until,
            handoff: None,
            renew_at: first_renewal,
            metrics: g.metrics,
            local: g.local,
            live: g.live,
            runtime: None,
        })
    }

    /// The guard of the next task of this process on the key, holding the lease `c` its previous
    /// holder left, with the next fence of the block.
    pub(crate) fn carried(
        mut c: Carry,
        metrics: Option<Metrics>,
        local: Option<LocalGuard>,
        live: Arc<LiveSet>,
    ) -> Self {
        c.armed = false;
        let renew_at = if c.opts.auto_renew {
            Some(c.renew_at.unwrap_or_else(Instant::now))
        } else {
            None
        };
        // In the live set before it stops counting as in transit (see `release_all`).
        let _transit = c.transit.take();
        let runtime = c.runtime.take();
        Self::build(Parts {
            store: c.store.clone(),
            key: c.key.clone(),
            token: std::mem::take(&mut c.token),
            record: c.record.clone(),
            fence: c.next_fence,
            block_end: c.block_end,
            opts: c.opts.clone(),
            valid_until: c.valid_until,
            handoff: None,
            renew_at,
            metrics,
            local,
            live,
            runtime,
        })
    }

    fn build(p: Parts) -> Self {
        let state = Watched::new(State {
            lost: None,
            handoff: p.handoff,
            released: false,
            valid_until: p.valid_until,
        });
        let id = p.live.next.fetch_add(1, Ordering::Relaxed);
        let mut record = p.record;
        record.fence = p.fence;
        let shared = Arc::new(Shared {
            store: p.store,
            key: p.key,
            token: p.token,
            record,
            fence: p.fence,
            block_end: p.block_end,
            opts: p.opts,
            state,
            metrics: p.metrics,
            acquired_at: Instant::now(),
            renewer: Mutex::new(None),
            scheduled: Mutex::new(None),
            renewals: p.live.renewals.clone(),
            live: Arc::downgrade(&p.live),
            id,
            runtime: crate::background::here().or(p.runtime),
        });
        p.live.guards.lock().insert(id, Arc::downgrade(&shared));
        if let Some(at) = p.renew_at {
            shared.renewals.schedule(at, &shared);
        }
        LeaseGuard {
            shared,
            local: Mutex::new(p.local),
        }
    }

    /// The fence of this acquisition: strictly greater than every earlier fence of this key.
    /// Hand it to the resource the lease guards, which refuses a write with a fence below the
    /// highest it has seen (a holder paused past its TTL, then resumed, is stopped there).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let first = locks.lock("k")?.try_acquire().await?.expect("free");
    /// let f1 = first.fence();
    /// first.release().await?;
    /// let second = locks.lock("k")?.try_acquire().await?.expect("free");
    /// assert!(second.fence() > f1);
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn fence(&self) -> u64 {
        self.shared.fence
    }

    /// The key held (see [`record`](Self::record) for an example).
    pub fn key(&self) -> &Key {
        &self.shared.key
    }

    /// The record as written when the lease was granted, with this acquisition's fence (the
    /// record in the store shows the last fence of the block reserved with the lease, which is
    /// at least this one). It is not updated by renewals: read the store for the current record.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Locks};
    /// let locks = Locks::new(MemoryStore::new()).with_holder(HolderId::new("web-1"));
    /// let guard = locks.lock("user:alice")?.try_acquire().await?.expect("free");
    /// let r = guard.record();
    /// assert_eq!((r.key.as_str(), guard.key().as_str()), ("user:alice", "user:alice"));
    /// assert_eq!(r.holder.as_deref(), Some("web-1"));
    /// assert_eq!(r.token.as_deref(), Some(guard.token()));
    /// assert_eq!(r.fence, guard.fence());
    /// # guard.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn record(&self) -> &LeaseRecord {
        &self.shared.record
    }

    /// The owner token of this acquisition: unique per acquisition, also for one holder (see
    /// [`record`](Self::record) for an example).
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Whether the lease is surely still ours: not lost, not released, and not past the time up
    /// to which the last successful renewal vouches (the TTL minus the drift margin, counted from
    /// when the grant or renewal request was sent). It asks no store: check it before each write
    /// that the lease protects, and pass the [`fence`](Self::fence) along too.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
    /// assert!(guard.is_current());
    /// guard.release().await?;
    /// assert!(!guard.is_current());
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn is_current(&self) -> bool {
        let s = self.shared.state.borrow();
        s.lost.is_none() && !s.released && Instant::now() < s.valid_until
    }

    /// Completes when the lease is lost, with the reason. Never completes after `release`.
    ///
    /// # Cancel safety
    /// Cancel safe; call it again to wait again.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, Locks, LostReason};
    /// let locks = Locks::new(MemoryStore::new());
    /// let guard = locks.lock("job")?.try_acquire().await?.expect("free");
    /// // An operator frees it: the holder's next renewal is refused, and `lost()` fires.
    /// locks.store().force_release(guard.key()).await?;
    /// let reason = guard.lost().await;
    /// assert!(!guard.is_current(), "{reason}");
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn lost(&self) -> LostReason {
        loop {
            let changed = self.shared.state.changed();
            let deadline = {
                let s = self.shared.state.borrow();
                if let Some(r) = &s.lost {
                    return r.clone();
                }
                if !self.shared.opts.auto_renew && !s.released {
                    Some(s.valid_until)
                } else {
                    None
                }
            };
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, changed).await.is_err() {
                        self.shared.mark_lost(LostReason::Expired);
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Completes when a waiter has registered for this lease (the "someone is waiting:
    /// checkpoint and hand over" of a single-waiter lock), with the waiter's identity. Fires within one renewal period of
    /// the registration. Releasing then hands the lease to that waiter.
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Locks};
    /// use std::time::Duration;
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    /// let b = Locks::from_arc(store).with_holder(HolderId::new("b"));
    /// let guard = a.lock("task-9")?.ttl(Duration::from_secs(2)).acquire().await?;
    /// let waiter = tokio::spawn(async move {
    ///     b.lock("task-9")?.wait(Duration::from_secs(10)).acquire().await
    /// });
    /// assert_eq!(guard.handoff_requested().await, "b"); // checkpoint, then hand over
    /// guard.release().await?;
    /// assert_eq!(waiter.await.expect("task")?.record().holder.as_deref(), Some("b"));
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn handoff_requested(&self) -> String {
        loop {
            let changed = self.shared.state.changed();
            if let Some(w) = &self.shared.state.borrow().handoff {
                return w.clone();
            }
            changed.await;
        }
    }

    /// Whether a waiter has asked for the lease: the non-waiting form of
    /// [`handoff_requested`](Self::handoff_requested), set at the first renewal that sees a
    /// registered waiter and never cleared. Never set without auto-renewal.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::memory::MemoryStore, HolderId, Locks};
    /// use std::time::Duration;
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    /// let b = Locks::from_arc(store).with_holder(HolderId::new("b"));
    /// let guard = a.lock("k")?.renew_every(Duration::from_millis(20)).acquire().await?;
    /// assert!(!guard.is_handoff_requested());
    /// let waiter = tokio::spawn(async move { b.lock("k")?.acquire().await });
    /// while !guard.is_handoff_requested() {
    ///     tokio::time::sleep(Duration::from_millis(5)).await;
    /// }
    /// guard.release().await?;
    /// waiter.await.expect("task")?.release().await?;
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn is_handoff_requested(&self) -> bool {
        self.shared.state.borrow().handoff.is_some()
    }

    /// Releases the lease. Idempotent: later calls answer [`Released::AlreadyReleased`].
    ///
    /// When other tasks of this process wait for the key (the local layer is on) and fences of
    /// the block reserved with the lease are left, the lease is handed to the next of them
    /// without a store call, with the next fence; otherwise it is freed in the store.
    ///
    /// # Errors
    /// A store error; the lease then expires by its TTL (and, on the file store, at once if this
    /// process exits).
    ///
    /// # Cancel safety
    /// If cancelled, the lease is still marked released locally and expires by its TTL.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::Released;
    /// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
    /// let guard = locks.lock("k")?.try_acquire().await?.expect("free");
    /// assert_eq!(guard.release().await?, Released::Released);
    /// assert_eq!(guard.release().await?, Released::AlreadyReleased);
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub async fn release(&self) -> Result<Released> {
        let local = self.local.lock().take();
        let renew_at = *self.shared.scheduled.lock();
        let Some(prior) = self.shared.begin_release() else {
            return Ok(Released::AlreadyReleased);
        };
        let local = match self.shared.pass_on(local, &prior, renew_at) {
            Ok(unclaimed) => {
                if let Some(c) = unclaimed {
                    c.release().await;
                }
                return Ok(Released::Released);
            }
            Err(local) => local,
        };
        let out = self.shared.release_in_store(prior).await;
        drop(local);
        out
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let local = self.local.lock().take();
        let renew_at = *self.shared.scheduled.lock();
        let Some(prior) = self.shared.begin_release() else {
            return;
        };
        // Handed on, or an unclaimed lease dropped (which releases it in the background).
        let local = match self.shared.pass_on(local, &prior, renew_at) {
            Ok(_) => return,
            Err(local) => local,
        };
        let shared = self.shared.clone();
        crate::background::spawn_on(self.shared.runtime.as_ref(), async move {
            if let Err(e) = shared.release_in_store(prior).await {
                tracing::warn!(key = %shared.key, error = %e,
                    "background release failed; the lease expires by its TTL");
            }
            drop(local);
        });
    }
}

impl Shared {
    /// After `begin_release` (with `prior` loss): hands the lease to the next task of this
    /// process waiting for the key, if one waits, the lease is not lost, no other holder asked
    /// for it, fences of the block are left and it is surely valid for longer than the drift
    /// margin. `Ok(unclaimed)` when handed on (`unclaimed`: every waiter gave up meanwhile; the
    /// caller releases it in the store); `Err(local)` when the lease is to be freed in the store.
    fn pass_on(
        &self,
        local: Option<LocalGuard>,
        prior: &Option<LostReason>,
        renew_at: Option<Instant>,
    ) -> std::result::Result<Option<Carry>, Option<LocalGuard>> {
        let Some(l) = local else {
            return Err(None);
        };
        if prior.is_some() || l.waiting() == 0 || self.fence >= self.block_end {
            return Err(Some(l));
        }
        let live = match self.live.upgrade() {
            Some(live) if !live.closing.load(Ordering::SeqCst) => live,
            _ => return Err(Some(l)),
        };
        let valid_until = {
            let s = self.state.borrow();
            if s.handoff.is_some() || s.valid_until <= Instant::now() + self.opts.drift() {
                return Err(Some(l));
            }
            s.valid_until
        };
        if let Some(m) = &self.metrics {
            m.releases.inc();
            m.local_handoffs.inc();
            m.hold_seconds
                .observe(self.acquired_at.elapsed().as_secs_f64());
        }
        tracing::trace!(key = %self.key, fence = self.fence, "lease handed to the next local task");
        Ok(l.leave(Carry {
            store: self.store.clone(),
            key: self.key.clone(),
            token: self.token.clone(),
            record: self.record.clone(),
            opts: self.opts.clone(),
            valid_until,
            renew_at,
            next_fence: self.fence + 1,
            block_end: self.block_end,
            armed: true,
            transit: Some(Transit::start(&live.transit)),
            runtime: self.runtime.clone(),
        }))
    }
}
