//! Hearing of a key's changes as soon as the store tells them, for `watch` (one key) and `serve`
//! (the held keys under a prefix): the store's notification, subscribed again when it goes deaf,
//! and, on a store that notifies only the releases someone waits for (Redis, PostgreSQL), the
//! request to notify the held lease's release.

use crate::records::state;
use leasehold::{ChangeWatch, Inspection, Key, LockStore};

/// One key followed: its subscription and the lease whose release the store was asked to notify.
#[derive(Debug)]
pub(crate) struct Follow {
    key: Key,
    changes: Option<Box<dyn ChangeWatch>>,
    /// Whether a lost subscription is still to be made again.
    resubscribe: bool,
    /// The lease (its fence) whose release the store was asked to notify.
    notified: Option<u64>,
}

impl Follow {
    /// Subscribes to `key`'s changes (a store without notification: [`changed`](Self::changed)
    /// never completes, and the caller looks again on its own schedule).
    ///
    /// # Errors
    /// The store's, when subscribing fails.
    pub(crate) async fn start(store: &dyn LockStore, key: Key) -> leasehold::Result<Self> {
        let changes = store.subscribe(&key).await?;
        Ok(Follow {
            key,
            changes,
            resubscribe: false,
            notified: None,
        })
    }

    /// After a look at the key (`seen` at `now`): subscribes again if the notification went deaf,
    /// and asks the store to notify the release of the lease seen held. Returns `false` when the
    /// lease changed while the store was asked (look again).
    pub(crate) async fn seen(
        &mut self,
        store: &dyn LockStore,
        seen: Option<&Inspection>,
        now: u64,
    ) -> bool {
        if self.resubscribe || self.changes.as_ref().is_some_and(|c| c.stale()) {
            // The notification's connection ended or its server stopped answering (a failover):
            // subscribe again; until that works, the key is looked at on the caller's schedule.
            self.changes = store.subscribe(&self.key).await.unwrap_or_default();
            self.resubscribe = self.changes.is_none();
        }
        match seen {
            Some(Inspection::Record(r)) if state(r, now) == "held" => {
                if self.notified == Some(r.fence) {
                    return true;
                }
                match store.notify_release(&self.key, Some(r.fence)).await {
                    Ok(true) => {
                        self.notified = Some(r.fence);
                        true
                    }
                    Ok(false) => false,
                    // Its release is then seen on the caller's schedule.
                    Err(e) => {
                        tracing::debug!(key = %self.key, error = %e, "cannot ask for the release to be notified");
                        true
                    }
                }
            }
            // Nothing held: the next lease is asked for, whatever its fence (a store that lost
            // its data may count fences again).
            _ => {
                self.notified = None;
                true
            }
        }
    }

    /// Completes when the key may have changed (spurious wake-ups allowed); never without a
    /// notification. Cancel safe.
    pub(crate) async fn changed(&mut self) {
        match self.changes.as_mut() {
            Some(c) => c.changed().await,
            None => std::future::pending().await,
        }
    }
}
