//! The local layer: a per-key async mutex map in front of a store.
//!
//! Tasks of one process that want the same key queue here, first come first served (tokio's mutex
//! is fair), and only the one at the head talks to the store. Entries exist only while some task
//! holds or waits for the key, so a million distinct keys over time do not grow memory.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

const SHARDS: usize = 64;

type Slot = Arc<AsyncMutex<()>>;
type Shard = Mutex<HashMap<Box<str>, Slot>>;

/// A per-key async mutex map; see the [module docs](self).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let locks = leasehold::LocalLocks::new();
/// let g = locks.lock("user:alice").await;
/// assert!(locks.try_lock("user:alice").is_none());
/// drop(g);
/// assert_eq!(locks.len(), 0, "unused entries are removed");
/// # });
/// ```
pub struct LocalLocks {
    shards: Box<[Shard]>,
    hasher: std::collections::hash_map::RandomState,
}

impl fmt::Debug for LocalLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalLocks")
            .field("keys", &self.len())
            .finish()
    }
}

/// Holds one key of a [`LocalLocks`]; dropping it lets the next waiter in.
#[must_use = "the key is unlocked when the guard is dropped"]
pub struct LocalGuard {
    map: Arc<LocalLocks>,
    shard: usize,
    key: Box<str>,
    slot: Slot,
    guard: Option<OwnedMutexGuard<()>>,
}

impl fmt::Debug for LocalGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalGuard")
            .field("key", &self.key)
            .field("held", &self.guard.is_some())
            .finish()
    }
}

impl LocalLocks {
    /// An empty map.
    pub fn new() -> Arc<Self> {
        Arc::new(LocalLocks {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
        })
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    fn enter(self: &Arc<Self>, key: &str) -> LocalGuard {
        let shard = self.shard_of(key);
        let slot = {
            let mut map = self.shards[shard].lock();
            match map.get(key) {
                Some(s) => s.clone(),
                None => {
                    let s = Slot::default();
                    map.insert(key.into(), s.clone());
                    s
                }
            }
        };
        LocalGuard {
            map: self.clone(),
            shard,
            key: key.into(),
            slot,
            guard: None,
        }
    }

    /// Waits for `key` (FIFO among this process's tasks).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait leaves no entry behind and loses nobody's place but its own.
    pub async fn lock(self: &Arc<Self>, key: &str) -> LocalGuard {
        let mut g = self.enter(key);
        g.guard = Some(g.slot.clone().lock_owned().await);
        g
    }

    /// Takes `key` if no task of this process holds it.
    pub fn try_lock(self: &Arc<Self>, key: &str) -> Option<LocalGuard> {
        let mut g = self.enter(key);
        g.guard = Some(g.slot.clone().try_lock_owned().ok()?);
        Some(g)
    }

    /// Keys currently held or waited for.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no key is held or waited for.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LocalGuard {
    /// The key held.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for LocalGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.map.shards[self.shard].lock();
        // The map's reference and ours: nobody else holds or waits.
        if Arc::strong_count(&self.slot) == 2 {
            if let Some(s) = map.get(&self.key) {
                if Arc::ptr_eq(s, &self.slot) {
                    map.remove(&self.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_million_keys_leave_nothing_behind() {
        let l = LocalLocks::new();
        for i in 0..1_000_000u32 {
            let _g = l.lock(&i.to_string()).await;
        }
        assert!(l.is_empty());
    }

    #[tokio::test]
    async fn waiters_are_served_in_order_and_cancelled_waits_clean_up() {
        let l = LocalLocks::new();
        let g = l.lock("k").await;
        let order = Arc::new(Mutex::new(vec![]));
        let mut tasks = vec![];
        for i in 0..5 {
            let (l, order) = (l.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _g = l.lock("k").await;
                order.lock().push(i);
            }));
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
        }
        let cancelled =
            tokio::time::timeout(std::time::Duration::from_millis(1), l.lock("k")).await;
        assert!(cancelled.is_err());
        drop(g);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock(), vec![0, 1, 2, 3, 4]);
        assert!(l.is_empty());
    }
}
