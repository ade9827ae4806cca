//! Wake-ups for waiters: the store's connection listens on the table's channel, where every
//! release someone waits for (a live registered waiter, or a `watched` mark), a lock's or a
//! permit's, force-release and waiter withdrawal is notified (at its commit) with the key as
//! payload; [`Hub`] wakes that
//! key's subscriptions. When the connection ends, every subscription
//! is woken and turns stale, and its waiter subscribes again (which connects again and listens
//! again).

use crate::pg::conn::OnNotice;
use crate::store::ChangeWatch;
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Each key's watch sender and how many subscriptions share it.
#[derive(Debug, Default)]
pub(super) struct Hub {
    subs: Mutex<HashMap<String, (watch::Sender<()>, usize)>>,
}

impl Hub {
    /// What the connection calls with each notification's payload (a key), and with `None` when
    /// it ends.
    pub(super) fn listener(self: &Arc<Self>) -> OnNotice {
        let hub = Arc::downgrade(self);
        Arc::new(move |payload| {
            let Some(hub) = hub.upgrade() else {
                return;
            };
            let subs = hub.subs.lock();
            match payload {
                Some(key) => {
                    if let Some((tx, _)) = subs.get(key) {
                        tx.send_replace(());
                    }
                }
                None => subs.values().for_each(|(tx, _)| {
                    tx.send_replace(());
                }),
            }
        })
    }

    /// A subscription to `key`'s notifications on the connection whose liveness `alive` tells.
    pub(super) fn subscribe(self: &Arc<Self>, key: &str, alive: Arc<AtomicBool>) -> PgWatch {
        let mut subs = self.subs.lock();
        let entry = subs
            .entry(key.to_owned())
            .or_insert_with(|| (watch::Sender::new(()), 0));
        entry.1 += 1;
        PgWatch {
            rx: entry.0.subscribe(),
            key: key.to_owned(),
            hub: self.clone(),
            alive,
        }
    }
}

/// A subscription to one key's releases ([`ChangeWatch`]).
#[derive(Debug)]
pub(super) struct PgWatch {
    rx: watch::Receiver<()>,
    key: String,
    hub: Arc<Hub>,
    alive: Arc<AtomicBool>,
}

#[async_trait]
impl ChangeWatch for PgWatch {
    async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn stale(&self) -> bool {
        !self.alive.load(Ordering::SeqCst)
    }
}

impl Drop for PgWatch {
    fn drop(&mut self) {
        let mut subs = self.hub.subs.lock();
        if let Some(entry) = subs.get_mut(&self.key) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                subs.remove(&self.key);
            }
        }
    }
}
