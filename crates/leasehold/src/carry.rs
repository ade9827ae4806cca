//! A held store lease on its way from a task of this process that released it to the next task
//! waiting for the key: the [`Carry`] the guard leaves in the key's local slot (see
//! [`crate::local`]) and the next task's guard takes, and the count of such leases in transit that
//! `release_all` waits for.
//!
//! Both [`crate::guard`] (which makes and takes a carry) and [`crate::local`] (whose slots hold
//! one) depend on this module; it depends on neither.

use crate::key::Key;
use crate::options::LockOptions;
use crate::record::LeaseRecord;
use crate::store::{LockStore, RenewOutcome};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many leases under one [`crate::Locks`] were handed on and not yet taken by the next task
/// (or released, if nobody took them).
#[derive(Debug, Default)]
pub(crate) struct InTransit {
    count: AtomicUsize,
    done: Notify,
}

impl InTransit {
    /// Whether a handed-on lease is in transit.
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    /// Waits until no handed-on lease is in transit, or `deadline`; whether none is.
    pub(crate) async fn settle(&self, deadline: Instant) -> bool {
        loop {
            let done = self.done.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return self.count.load(Ordering::SeqCst) == 0;
            }
        }
    }
}

/// Counts a handed-on lease as in transit until dropped (taken by the next task's guard, which is
/// then in the live set, or released in the store).
#[derive(Debug)]
pub(crate) struct Transit(Weak<InTransit>);

impl Transit {
    pub(crate) fn start(counter: &Arc<InTransit>) -> Self {
        counter.count.fetch_add(1, Ordering::SeqCst);
        Transit(Arc::downgrade(counter))
    }
}

impl Drop for Transit {
    fn drop(&mut self) {
        if let Some(c) = self.0.upgrade() {
            c.count.fetch_sub(1, Ordering::SeqCst);
            c.done.notify_waiters();
        }
    }
}

/// A held store lease on its way from a task that released it to the next task of this process
/// waiting for the key (in the key's local slot). Dropped without being taken, it is released in
/// the store in the background.
///
/// Made by the releasing guard and taken apart by the next task's guard (see
/// [`crate::LeaseGuard`]), so its fields are open to the crate.
pub(crate) struct Carry {
    pub(crate) store: Arc<dyn LockStore>,
    pub(crate) key: Key,
    pub(crate) token: String,
    pub(crate) record: LeaseRecord,
    pub(crate) opts: LockOptions,
    pub(crate) valid_until: Instant,
    pub(crate) renew_at: Option<Instant>,
    pub(crate) next_fence: u64,
    pub(crate) block_end: u64,
    /// Released in the store when dropped (cleared once taken or released).
    pub(crate) armed: bool,
    pub(crate) transit: Option<Transit>,
    /// The runtime its lease was granted under, to release it on when dropped outside one.
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

impl Carry {
    /// Whether a task asking for `holder` with `opts` may take this lease as it is: same holder,
    /// same lease terms and labels, and surely valid for longer than the drift margin.
    pub(crate) fn fits(&self, holder: &str, opts: &LockOptions) -> bool {
        self.record.holder.as_deref() == Some(holder)
            && self.opts.ttl == opts.ttl
            && self.opts.renew_period() == opts.renew_period()
            && self.opts.auto_renew == opts.auto_renew
            && self.opts.labels == opts.labels
            && self.valid_until > Instant::now() + self.opts.drift()
    }

    /// Confirms with the store that the lease is still ours when nobody has for a renewal period
    /// or more (it waited in the slot, where nothing renews it, or its holder did not renew): it
    /// may have been force-released or taken over meanwhile. A lease confirmed sooner is handed
    /// on as it is; that it was taken away meanwhile is then found by the next task's first
    /// renewal, at most a renewal period later.
    ///
    /// Whether the lease may be handed on. A renewal refused disarms the carry (nothing is left
    /// to release); a renewal that fails leaves it armed, so it is released once dropped.
    ///
    /// # Cancel safety
    /// Dropped mid-way, the carry is dropped with it and released in the background.
    pub(crate) async fn confirm(&mut self) -> bool {
        let (ttl, drift, period) = (self.opts.ttl, self.opts.drift(), self.opts.renew_period());
        let live = ttl.saturating_sub(drift);
        let confirmed = self
            .valid_until
            .checked_sub(live)
            .unwrap_or(self.valid_until);
        if Instant::now() < confirmed + period {
            return true;
        }
        let sent = Instant::now();
        let call = self.store.renew(&self.key, &self.token, ttl);
        match tokio::time::timeout_at(self.valid_until, call).await {
            Ok(Ok(RenewOutcome::Renewed(_))) => {
                self.valid_until = sent + live;
                self.renew_at = self.renew_at.map(|_| sent + period);
                true
            }
            Ok(Ok(RenewOutcome::Lost(reason))) => {
                tracing::debug!(key = %self.key, %reason, "a lease waiting to be handed on was lost");
                self.armed = false;
                false
            }
            Ok(Err(e)) => {
                tracing::debug!(key = %self.key, error = %e, "a lease waiting to be handed on could not be renewed");
                false
            }
            Err(_) => false,
        }
    }

    /// Releases the lease in the store now (errors only logged: it then expires by its TTL).
    ///
    /// # Cancel safety
    /// The carry stays armed until the release has answered: dropped mid-way, it is released in
    /// the background (a second release of the same token is harmless).
    pub(crate) async fn release(mut self) {
        if self.armed {
            release_carried(&*self.store, &self.key, &self.token).await;
            self.armed = false;
        }
        drop(self.transit.take());
    }
}

/// Releases a carried lease nobody took; errors are only logged (it then expires by its TTL).
async fn release_carried(store: &dyn LockStore, key: &Key, token: &str) {
    if let Err(e) = store.release(key, token).await {
        tracing::debug!(key = %key, error = %e, "could not release a carried lease; it expires by its TTL");
    }
}

impl fmt::Debug for Carry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Carry")
            .field("key", &self.key)
            .field("next_fence", &self.next_fence)
            .finish()
    }
}

impl Drop for Carry {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, key, token, transit) = (
            self.store.clone(),
            self.key.clone(),
            std::mem::take(&mut self.token),
            self.transit.take(),
        );
        crate::background::spawn_on(self.runtime.as_ref(), async move {
            release_carried(&*store, &key, &token).await;
            drop(transit);
        });
    }
}
