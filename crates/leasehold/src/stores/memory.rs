//! In-process stores: [`MemoryStore`] (lock-level) and [`RecordMemoryStore`] (record-level, used
//! through the generic adapter).
//!
//! Checklist — native TTL: no; expiry: [`MemoryStore`] compares the written times with this
//! process's wall clock (the clock that wrote them), [`RecordMemoryStore`] goes through the generic
//! adapter, which judges expiry by observation as for any compare-and-set store
//! ([`crate::adapter`]); watch: yes for [`MemoryStore`] (per-key change channel), no for
//! [`RecordMemoryStore`] (waiters poll, which tests the polling path); liveness: not applicable;
//! fence: [`MemoryStore`] `max(previous + 1, now in µs)` per key, the common rule of the
//! crate-private `decide` module; [`RecordMemoryStore`] from its store-wide version counter, which
//! no deletion lowers (revisions, see [`crate::adapter`]).
//!
//! [`MemoryStore`] keeps no rules of its own: each step asks `crate::decide` under the key's lock
//! ([`RecordMemoryStore`] through the adapter, which does the same):
//!
//! | step | rule |
//! | --- | --- |
//! | acquire (locks and permits) | acquire → `decide::Rules::acquire` |
//! | renew | renew → `decide::Rules::renew` |
//! | release | release → `decide::Rules::release` |
//! | a waiter's withdrawal | the line's `leave_line` |
//! | force release | freed → `decide::Rules::freed` |
//! | cleanup | removable → `decide::Rules::removable` |
//!
//! Both are for tests, single-process programs and as a reference; nothing survives the process.

use crate::decide::{self, Current, Now, Rules};
use crate::error::Result;
use crate::key::Key;
use crate::record::{now_ms, LeaseRecord};
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, RecordStore, ReleaseOutcome, RenewOutcome, Stored,
};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug)]
struct Slot {
    record: Option<LeaseRecord>,
    tx: watch::Sender<()>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            record: None,
            tx: watch::Sender::new(()),
        }
    }
}

/// The in-process lock store.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, Locks};
/// let locks = Locks::new(MemoryStore::new());
/// let a = locks.lock("job")?.try_acquire().await?.expect("free");
/// assert!(locks.lock("job")?.try_acquire().await?.is_none());
/// a.release().await?;
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Default)]
pub struct MemoryStore {
    slots: Mutex<HashMap<String, Slot>>,
    /// The floor's keys ([`LockStore::floor`]).
    floor: std::sync::Arc<MemoryFloor>,
}

/// The memory store's floor: a map under a mutex, a key inserted if absent and removed by its
/// token (what the store does under its lock, without its rules and records).
#[derive(Debug, Default)]
struct MemoryFloor(Mutex<HashMap<String, String>>);

#[async_trait]
impl crate::floor::Floor for MemoryFloor {
    fn describe(&self) -> String {
        "insert if absent into a map under a mutex, remove".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<crate::floor::Taken>> {
        let mut map = self.0.lock();
        if map.contains_key(key.as_str()) {
            return Ok(None);
        }
        let token = crate::holder::new_token();
        map.insert(key.as_str().to_owned(), token.clone());
        Ok(Some(crate::floor::Taken::new(token)))
    }

    async fn release(&self, key: &Key, taken: crate::floor::Taken) -> Result<()> {
        let mut map = self.0.lock();
        if map.get(key.as_str()).map(String::as_str) == Some(taken.as_str()) {
            map.remove(key.as_str());
        }
        Ok(())
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn step<T>(
        &self,
        key: &Key,
        f: impl FnOnce(Option<&LeaseRecord>) -> (T, Option<LeaseRecord>),
    ) -> T {
        let mut slots = self.slots.lock();
        let slot = slots.get(key.as_str());
        let (out, write) = f(slot.and_then(|s| s.record.as_ref()));
        if let Some(write) = write {
            let slot = slots
                .entry(key.as_str().to_owned())
                .or_insert_with(Slot::new);
            slot.record = Some(write);
            slot.tx.send_replace(());
        }
        out
    }
}

#[derive(Debug)]
struct MemoryWatch(watch::Receiver<()>);

#[async_trait]
impl ChangeWatch for MemoryWatch {
    async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            // The slot was removed: the key changed (cleanup). Do not spin.
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl LockStore for MemoryStore {
    fn describe(&self) -> String {
        "memory://".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: false,
            watch: true,
            liveness: false,
            fence_source: "max(previous + 1, µs clock) per key",
            waiter_line: true,
            release_grants: true,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::Host,
        }
    }

    fn floor(&self) -> Option<std::sync::Arc<dyn crate::floor::Floor>> {
        Some(self.floor.clone())
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.step(&req.key, |cur| {
            let current = cur.map_or(Current::Missing, Current::Record);
            match Rules::clock(Now::wall()).acquire(current, req, false) {
                Ok(d) => (Ok(d.outcome), d.write),
                Err(e) => (Err(e), None),
            }
        })
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        Ok(self.step(key, |cur| {
            let d = Rules::clock(Now::wall()).renew(cur, token, crate::record::ms(ttl));
            (d.outcome, d.write)
        }))
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        Ok(self.step(key, |cur| {
            let d = Rules::clock(Now::wall()).release(cur, token);
            (d.outcome, d.write)
        }))
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        self.step(key, |cur| {
            let rules = Rules::clock(Now::wall());
            ((), decide::withdraw_waiter(cur, token, &rules))
        });
        Ok(())
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        let slots = self.slots.lock();
        Ok(slots
            .get(key.as_str())
            .and_then(|s| s.record.clone())
            .map(Inspection::Record))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        let slots = self.slots.lock();
        let mut out: Vec<LeaseRecord> = slots
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .filter_map(|(_, s)| s.record.clone())
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out.into_iter().map(Inspection::Record).collect())
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        Ok(self.step(key, |cur| match cur {
            Some(r) => (
                Some(r.clone()),
                decide::force_freed(r, None, now_ms(), decide::Expiry::Clock),
            ),
            None => (None, None),
        }))
    }

    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        Ok(self.step(key, |cur| {
            let write = cur.and_then(|r| {
                decide::force_freed(r, Some(holder), now_ms(), decide::Expiry::Clock)
            });
            (write.as_ref().and(cur.cloned()), write)
        }))
    }

    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        let rules = Rules::clock(Now::wall());
        let mut report = CleanupReport::default();
        self.slots.lock().retain(|_, s| {
            let remove = match &s.record {
                Some(r) => rules.removable(r, None, older_than),
                None => s.tx.receiver_count() == 0,
            };
            if remove {
                report.removed += usize::from(s.record.is_some());
            } else {
                report.kept += 1;
            }
            !remove
        });
        progress.add_finished((report.removed + report.kept) as u64);
        Ok(report)
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        let mut slots = self.slots.lock();
        let slot = slots
            .entry(key.as_str().to_owned())
            .or_insert_with(Slot::new);
        Ok(Some(Box::new(MemoryWatch(slot.tx.subscribe()))))
    }
}

type Objects = HashMap<String, (Vec<u8>, u64)>;

/// An in-process [`RecordStore`]: records kept as JSON bytes with a version counter, so the generic
/// adapter is exercised exactly as over a remote compare-and-set store, corrupt records included
/// ([`RecordMemoryStore::put_raw`]).
#[derive(Debug, Default)]
pub struct RecordMemoryStore {
    /// (version counter, key → (bytes, version))
    objects: Mutex<(u64, Objects)>,
}

impl RecordMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Overwrites the stored bytes of `key` unconditionally (to test corrupt-record recovery).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{adapter::RecordLockStore, memory::RecordMemoryStore};
    /// use leasehold::{AcquireOutcome, AcquireRequest, Inspection, Key, LockStore};
    /// use std::time::Duration;
    /// // Clocks assumed in step (no skew bound), so no lease here outlasts its TTL.
    /// let store = RecordLockStore::new(RecordMemoryStore::new()).with_max_clock_skew(Duration::ZERO);
    /// let key = Key::new("k")?;
    /// store.inner().put_raw(&key, br#"{"fence": 9000000000000000, "hold"#);
    /// // Reported as corrupt, never fatal.
    /// assert!(matches!(store.inspect(&key).await?, Some(Inspection::Corrupt { .. })));
    /// // Whoever wrote it may still hold it: held by "unknown (corrupt record)" until the damaged
    /// // bytes were seen unchanged for longer than a lease lasts (here the 50 ms TTL asked for).
    /// let req = AcquireRequest::new(key.clone(), "a", Duration::from_millis(50));
    /// let AcquireOutcome::Held(r) = store.acquire(&req).await? else { panic!("granted") };
    /// assert_eq!(r.holder.as_deref(), Some("unknown (corrupt record)"));
    /// tokio::time::sleep(Duration::from_millis(60)).await;
    /// // Then recovered, the fence above the damage.
    /// let AcquireOutcome::Granted(r) = store.acquire(&req).await? else { panic!("not granted") };
    /// assert!(r.fence > 9_000_000_000_000_000);
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn put_raw(&self, key: &Key, bytes: &[u8]) {
        let mut g = self.objects.lock();
        g.0 += 1;
        let v = g.0;
        g.1.insert(key.as_str().to_owned(), (bytes.to_vec(), v));
    }
}

fn parse(bytes: &[u8], version: u64) -> Stored {
    match serde_json::from_slice::<LeaseRecord>(bytes) {
        Ok(record) => Stored::Record {
            record,
            version: version.to_string(),
        },
        Err(e) => Stored::Corrupt {
            version: version.to_string(),
            detail: e.to_string(),
            salvaged_fence: decide::salvage_fence(bytes),
        },
    }
}

fn encode(record: &LeaseRecord) -> Result<Vec<u8>> {
    serde_json::to_vec(record).map_err(|e| crate::error::Error::Store {
        source: None,
        store: "record-memory://".into(),
        detail: e.to_string(),
        retryable: false,
    })
}

#[async_trait]
impl RecordStore for RecordMemoryStore {
    fn describe(&self) -> String {
        "record-memory://".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: false,
            watch: false,
            liveness: false,
            fence_source: "the store-wide write counter (versions are revisions)",
            waiter_line: true,
            release_grants: true,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::Host,
        }
    }

    async fn get(&self, key: &Key) -> Result<Option<Stored>> {
        Ok(self
            .objects
            .lock()
            .1
            .get(key.as_str())
            .map(|(b, v)| parse(b, *v)))
    }

    async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>> {
        let bytes = encode(record)?;
        let mut g = self.objects.lock();
        if g.1.contains_key(key.as_str()) {
            return Ok(None);
        }
        g.0 += 1;
        let v = g.0;
        g.1.insert(key.as_str().to_owned(), (bytes, v));
        Ok(Some(v.to_string()))
    }

    async fn replace(
        &self,
        key: &Key,
        record: &LeaseRecord,
        version: &str,
    ) -> Result<Option<String>> {
        let bytes = encode(record)?;
        let mut g = self.objects.lock();
        g.0 += 1;
        let v = g.0;
        match g.1.get_mut(key.as_str()) {
            Some(slot) if slot.1.to_string() == version => {
                *slot = (bytes, v);
                Ok(Some(v.to_string()))
            }
            _ => Ok(None),
        }
    }

    async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
        let mut g = self.objects.lock();
        match g.1.get(key.as_str()) {
            Some((_, v)) if v.to_string() == version => {
                g.1.remove(key.as_str());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
        let g = self.objects.lock();
        let mut out: Vec<(String, Stored)> =
            g.1.iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, (b, v))| (k.clone(), parse(b, *v)))
                .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    fn revisions(&self) -> bool {
        true
    }

    fn revision(&self, version: &str) -> Option<u64> {
        version.parse().ok()
    }
}

/// What a `memory://` URL names: a new [`MemoryStore`] (it takes no parameters).
#[derive(Debug)]
pub(crate) struct MemoryUrl;

impl crate::store::StoreOptions for MemoryUrl {
    fn from_url(url: &str) -> Result<Self> {
        crate::url::Params::of_url(url).finish()?;
        Ok(MemoryUrl)
    }

    async fn connect(self) -> Result<std::sync::Arc<dyn LockStore>> {
        Ok(std::sync::Arc::new(MemoryStore::new()))
    }
}

/// What a `record-memory://[?max_clock_skew=…]` URL names: a new [`RecordMemoryStore`] behind
/// the [adapter](crate::adapter).
#[derive(Debug)]
pub(crate) struct RecordMemoryUrl {
    /// The adapter's `max_clock_skew`.
    pub(crate) max_clock_skew: Duration,
}

impl crate::store::RecordStoreOptions for RecordMemoryUrl {
    type Store = RecordMemoryStore;

    fn from_url(url: &str) -> Result<Self> {
        let mut params = crate::url::Params::of_url(url);
        let max_clock_skew = params.take_max_clock_skew()?;
        params.finish()?;
        Ok(RecordMemoryUrl { max_clock_skew })
    }

    fn max_clock_skew(&self) -> Duration {
        self.max_clock_skew
    }

    async fn connect(self) -> Result<RecordMemoryStore> {
        Ok(RecordMemoryStore::new())
    }
}
