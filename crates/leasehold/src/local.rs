//! The local layer: a per-key async mutex map in front of a store.

use crate::carry::Carry;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

const SHARDS: usize = 64;
const MIN_SWEEP: usize = 64;

/// One key: its mutex (holding a lease being carried to the next task, if any) and how many tasks
/// wait for it.
#[derive(Clone, Default)]
struct Slot {
    mutex: Arc<AsyncMutex<Option<Carry>>>,
    queued: Arc<AtomicUsize>,
}

impl Slot {
    /// Whether only the map refers to this slot.
    fn unused(&self) -> bool {
        Arc::strong_count(&self.mutex) == 1
    }

    /// Takes a carried lease left in the slot with nobody to take it (its drop releases it).
    fn reclaim(&self) -> Option<Carry> {
        self.mutex.clone().try_lock_owned().ok()?.take()
    }
}

/// Counts a task as queued on a slot while it waits; a wait given up as the last in line reclaims
/// a carried lease left for it.
struct Queued<'a> {
    slot: &'a Slot,
    done: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let last = self.slot.queued.fetch_sub(1, Ordering::SeqCst) == 1;
        if !self.done && last {
            drop(self.slot.reclaim());
        }
    }
}

/// The map of one shard, and the size at which it is next swept.
struct Shard {
    map: HashMap<Box<str>, Slot>,
    sweep_at: usize,
}

/// A per-key async mutex map.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let locks = leasehold::LocalLocks::new();
/// let g = locks.lock("user:alice").await;
/// assert!(locks.try_lock("user:alice").is_none());
/// drop(g);
/// assert_eq!(locks.len(), 0, "no key in use");
/// # });
/// ```
///
/// Tasks of one process that want the same key queue here, first come first served (tokio's mutex
/// is fair), and only the one at the head talks to the store. Unused entries are swept when a
/// shard grows past twice its entries in use (and at least 64), so a million distinct keys over
/// time keep memory bounded by the keys in use, while a hot key costs no allocation per lock.
///
/// A slot can also carry a held store lease from the task that releases it to the next task in
/// line (see [`crate::LeaseGuard`]: the lease is handed on without a store call, with the next
/// fence of the block reserved at acquisition). A carried lease nobody takes (every waiter gave
/// up) is released in the store.
pub struct LocalLocks {
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl fmt::Debug for LocalLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalLocks")
            .field("keys", &self.len())
            .finish()
    }
}

/// Holds one key of a [`LocalLocks`]; dropping it lets the next waiter in (see [`LocalLocks`]
/// for an example).
#[must_use = "the key is unlocked when the guard is dropped"]
pub struct LocalGuard {
    slot: Slot,
    guard: Option<OwnedMutexGuard<Option<Carry>>>,
}

impl fmt::Debug for LocalGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalGuard")
            .field("held", &self.guard.is_some())
            .finish()
    }
}

impl LocalLocks {
    /// An empty map.
    pub fn new() -> Arc<Self> {
        Arc::new(LocalLocks {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        sweep_at: MIN_SWEEP,
                    })
                })
                .collect(),
            hasher: Default::default(),
        })
    }

    /// The shard `key` lives in.
    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    fn slot(&self, key: &str) -> Slot {
        let mut s = self.shard(key).lock();
        if let Some(slot) = s.map.get(key) {
            return slot.clone();
        }
        if s.map.len() >= s.sweep_at {
            // Only the map refers to an unused slot.
            s.map.retain(|_, slot| !slot.unused());
            s.sweep_at = (s.map.len() * 2).max(MIN_SWEEP);
        }
        let slot = Slot::default();
        s.map.insert(key.into(), slot.clone());
        slot
    }

    /// Waits for `key` (FIFO among this process's tasks).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait loses nobody's place but its own.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::time::Duration;
    /// let locks = leasehold::LocalLocks::new();
    /// let held = locks.lock("k").await;
    /// let gave_up = tokio::time::timeout(Duration::from_millis(5), locks.lock("k")).await;
    /// assert!(gave_up.is_err());
    /// assert_eq!(locks.queued("k"), 0, "the dropped wait left no trace");
    /// drop(held);
    /// let _next = locks.lock("k").await;
    /// # });
    /// ```
    pub async fn lock(self: &Arc<Self>, key: &str) -> LocalGuard {
        let slot = self.slot(key);
        slot.queued.fetch_add(1, Ordering::SeqCst);
        let mut queued = Queued {
            slot: &slot,
            done: false,
        };
        let guard = slot.mutex.clone().lock_owned().await;
        queued.done = true;
        drop(queued);
        LocalGuard {
            slot,
            guard: Some(guard),
        }
    }

    /// Takes `key` if no task of this process holds it; `None` at once otherwise (see
    /// [`LocalLocks`] for an example).
    pub fn try_lock(self: &Arc<Self>, key: &str) -> Option<LocalGuard> {
        let slot = self.slot(key);
        let guard = slot.mutex.clone().try_lock_owned().ok()?;
        Some(LocalGuard {
            slot,
            guard: Some(guard),
        })
    }

    /// How many tasks wait for `key` right now (the holder not counted).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let locks = leasehold::LocalLocks::new();
    /// let held = locks.lock("k").await;
    /// let next = tokio::spawn({
    ///     let locks = locks.clone();
    ///     async move { drop(locks.lock("k").await) }
    /// });
    /// while locks.queued("k") == 0 {
    ///     tokio::task::yield_now().await;
    /// }
    /// assert_eq!(locks.queued("k"), 1);
    /// drop(held);
    /// next.await.expect("task");
    /// assert_eq!(locks.queued("k"), 0);
    /// # });
    /// ```
    pub fn queued(&self, key: &str) -> usize {
        self.shard(key)
            .lock()
            .map
            .get(key)
            .map_or(0, |slot| slot.queued.load(Ordering::SeqCst))
    }

    /// Keys currently held or waited for.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map.values().filter(|slot| !slot.unused()).count())
            .sum()
    }

    /// Whether no key is held or waited for.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries kept, in use or not yet swept (bounded, see the module docs): at least
    /// [`len`](Self::len).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let locks = leasehold::LocalLocks::new();
    /// drop(locks.lock("k").await);
    /// assert_eq!((locks.len(), locks.entries()), (0, 1)); // unused, kept until a sweep
    /// # });
    /// ```
    pub fn entries(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

impl LocalGuard {
    /// How many other tasks of this process wait for the key.
    pub(crate) fn waiting(&self) -> usize {
        self.slot.queued.load(Ordering::SeqCst)
    }

    /// Takes the lease the previous holder left for us, if any.
    pub(crate) fn take_carry(&mut self) -> Option<Carry> {
        self.guard.as_mut().and_then(|g| g.take())
    }

    /// Unlocks, leaving `carry` for the next task in line. Returns it when nobody is left to
    /// take it (every waiter gave up meanwhile): the caller releases it in the store.
    pub(crate) fn leave(mut self, carry: Carry) -> Option<Carry> {
        let Some(mut g) = self.guard.take() else {
            return Some(carry);
        };
        *g = Some(carry);
        drop(g);
        // A waiter that gave up after we looked, as the last one, may have found the slot still
        // locked by us; then nobody takes the lease, and it is ours to release.
        if self.waiting() == 0 {
            return self.slot.reclaim();
        }
        None
    }
}

impl Drop for LocalGuard {
    fn drop(&mut self) {
        // Unlock; the entry stays for the key's next user until a sweep finds it unused. A lease
        // left for us and not taken (our acquisition was cancelled) goes on to the next task, or
        // is released (dropped) when nobody waits.
        let carrying = self.guard.as_ref().is_some_and(|g| g.is_some());
        drop(self.guard.take());
        if carrying && self.waiting() == 0 {
            drop(self.slot.reclaim());
        }
        let _ = &self.slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_million_keys_keep_memory_bounded() {
        let l = LocalLocks::new();
        for i in 0..1_000_000u32 {
            let _g = l.lock(&i.to_string()).await;
        }
        assert!(l.is_empty());
        assert!(
            l.entries() <= SHARDS * MIN_SWEEP,
            "{} entries kept",
            l.entries()
        );
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
        assert!(l.is_empty(), "a cancelled wait left the key in use");
    }
}
