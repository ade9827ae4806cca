//! The one generic adapter from a compare-and-set [`RecordStore`] to a [`LockStore`].
//!
//! Every step is read → decide (the crate-private `decide` module) → conditional write; a write that loses the race
//! (version mismatch) re-reads and decides again, so concurrent acquirers, renewals, waiter
//! registrations and releases serialise on the record's version. Expiry is judged on the acquirer's
//! wall clock against the `expires` time written by the holder: bounded clock skew between machines
//! shortens or lengthens a lease by that skew (see the README's guarantees).
//!
//! The adapter remembers the record and version of its own last successful write per key. The
//! next step on that key first decides on that record and writes conditionally on that version,
//! without reading: if nobody else wrote since, the write succeeds and a renewal, a release or a
//! re-acquisition by this process costs one request instead of two; if somebody did, the write
//! fails (version mismatch), the memory is dropped, and the step reads and decides as usual. A
//! decision that writes nothing (the lease looks held) is never taken on remembered state.

use crate::decide::{self, Current, Now};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::{now_ms, LeaseRecord};
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupReport, GiveUp, Inspection,
    LockStore, RecordStore, ReleaseOutcome, RenewOutcome, Stored,
};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

/// How many lost races one call tolerates before reporting the store as too contended.
const MAX_RACES: usize = 64;

/// Remembered writes beyond this many keys are forgotten all at once (memory stays bounded).
const MAX_REMEMBERED: usize = 10_000;

/// A [`LockStore`] over any [`RecordStore`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{adapter::RecordLockStore, memory::RecordMemoryStore, Locks};
/// let locks = Locks::new(RecordLockStore::new(RecordMemoryStore::new()));
/// let guard = locks.lock("job")?.try_acquire().await?.expect("free");
/// assert!(guard.fence() > 0);
/// # guard.release().await?; Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct RecordLockStore<R> {
    inner: R,
    /// key → (version, record) of this adapter's last successful write.
    written: Mutex<HashMap<String, (String, LeaseRecord)>>,
}

impl<R: RecordStore> RecordLockStore<R> {
    /// Wraps a record store.
    pub fn new(inner: R) -> Self {
        RecordLockStore {
            inner,
            written: Mutex::new(HashMap::new()),
        }
    }

    fn remember(&self, key: &Key, version: String, record: LeaseRecord) {
        let mut w = self.written.lock();
        if w.len() >= MAX_REMEMBERED {
            w.clear();
        }
        w.insert(key.as_str().to_owned(), (version, record));
    }

    fn forget(&self, key: &Key) {
        self.written.lock().remove(key.as_str());
    }

    /// The wrapped record store.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Reads, decides with `f`, writes conditionally; retries lost races.
    ///
    /// With `create_first`, a key this adapter has no write of is first tried as if it had no
    /// record (one create, no read): a new key then costs one request, an existing one one more
    /// than reading first (the create is refused and the loop below reads).
    ///
    /// With `given_up` (an acquisition's flag), no further request is sent once the flag is set
    /// (a lost race is not retried): the call answers [`Error::GivenUp`].
    async fn cas<T>(
        &self,
        key: &Key,
        create_first: bool,
        given_up: Option<&GiveUp>,
        mut f: impl FnMut(Option<&Stored>) -> (T, Option<LeaseRecord>),
    ) -> Result<T> {
        let stop = || {
            given_up
                .is_some_and(GiveUp::is_given_up)
                .then(|| Error::GivenUp {
                    key: key.to_string(),
                })
        };
        if let Some(e) = stop() {
            return Err(e);
        }
        // Our own last write, if nobody wrote since: decide and write without reading.
        let remembered = self.written.lock().get(key.as_str()).cloned();
        if let Some((version, record)) = remembered {
            let cur = Stored::Record {
                record,
                version: version.clone(),
            };
            if let (out, Some(write)) = f(Some(&cur)) {
                match self.inner.replace(key, &write, &version).await {
                    Ok(Some(v)) => {
                        self.remember(key, v, write);
                        return Ok(out);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.forget(key);
                        return Err(e);
                    }
                }
            }
            self.forget(key);
        } else if create_first {
            if let (out, Some(write)) = f(None) {
                if let Some(v) = self.inner.create(key, &write).await? {
                    self.remember(key, v, write);
                    return Ok(out);
                }
            }
        }
        for _ in 0..MAX_RACES {
            if let Some(e) = stop() {
                return Err(e);
            }
            let cur = self.inner.get(key).await?;
            let (out, write) = f(cur.as_ref());
            let Some(write) = write else { return Ok(out) };
            let written = match &cur {
                None => self.inner.create(key, &write).await?,
                Some(Stored::Record { version, .. }) | Some(Stored::Corrupt { version, .. }) => {
                    self.inner.replace(key, &write, version).await?
                }
            };
            if let Some(v) = written {
                self.remember(key, v, write);
                return Ok(out);
            }
            tokio::task::yield_now().await;
        }
        Err(Error::Store {
            source: None,
            store: self.inner.describe(),
            detail: format!("{MAX_RACES} conditional writes in a row lost their race on {key}"),
            retryable: true,
        })
    }
}

fn record(s: Option<&Stored>) -> Option<&LeaseRecord> {
    match s {
        Some(Stored::Record { record, .. }) => Some(record),
        _ => None,
    }
}

#[async_trait]
impl<R: RecordStore> LockStore for RecordLockStore<R> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.cas(&req.key, true, Some(&req.given_up), |cur| {
            let current = match cur {
                None => Current::Missing,
                Some(Stored::Record { record, .. }) => Current::Record(record),
                Some(Stored::Corrupt { salvaged_fence, .. }) => Current::Corrupt {
                    salvaged_fence: *salvaged_fence,
                },
            };
            decide::acquire(current, req, Now::wall(), false)
        })
        .await
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        let ttl_ms = ttl.as_millis() as u64;
        self.cas(key, false, None, |cur| {
            decide::renew(record(cur), token, ttl_ms, now_ms())
        })
        .await
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        self.cas(key, false, None, |cur| {
            decide::release(record(cur), token, now_ms())
        })
        .await
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        self.cas(key, false, None, |cur| {
            ((), decide::withdraw_waiter(record(cur), token))
        })
        .await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        Ok(self
            .inner
            .get(key)
            .await?
            .map(|s| to_inspection(key.as_str().to_owned(), s)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        Ok(self
            .inner
            .list(prefix)
            .await?
            .into_iter()
            .map(|(n, s)| to_inspection(n, s))
            .collect())
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        self.cas(key, false, None, |cur| match record(cur) {
            Some(r) if r.token.is_some() => (Some(r.clone()), Some(decide::freed(r, now_ms()))),
            Some(r) => (Some(r.clone()), None),
            None => (None, None),
        })
        .await
    }

    async fn cleanup(&self, older_than: Duration) -> Result<CleanupReport> {
        let mut report = CleanupReport::default();
        let now = now_ms();
        for (_, stored) in self.inner.list("").await? {
            if let Stored::Record { record, version } = stored {
                let key = Key::new(&record.key)?;
                if decide::removable(&record, now, older_than.as_millis() as u64)
                    && self.inner.delete(&key, &version).await?
                {
                    self.forget(&key);
                    report.removed += 1;
                    continue;
                }
            }
            report.kept += 1;
        }
        Ok(report)
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        self.inner.subscribe(key).await
    }
}

fn to_inspection(name: String, s: Stored) -> Inspection {
    match s {
        Stored::Record { record, .. } => Inspection::Record(record),
        Stored::Corrupt { detail, .. } => Inspection::Corrupt { name, detail },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stores::memory::RecordMemoryStore;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A record store where every conditional write loses its race (another writer always got
    /// there first), and whose caller gives the acquisition up at its `give_up_at`-th write.
    #[derive(Debug)]
    struct AlwaysRaced {
        inner: RecordMemoryStore,
        writes: Arc<AtomicUsize>,
        give_up_at: usize,
        flag: GiveUp,
        /// How long each write takes to answer.
        latency: Duration,
    }

    impl AlwaysRaced {
        /// The store, and its count of writes.
        fn new(give_up_at: usize, flag: GiveUp, latency: Duration) -> (Self, Arc<AtomicUsize>) {
            let writes = Arc::new(AtomicUsize::new(0));
            let store = AlwaysRaced {
                inner: RecordMemoryStore::new(),
                writes: writes.clone(),
                give_up_at,
                flag,
                latency,
            };
            (store, writes)
        }

        async fn lose(&self) -> Result<Option<String>> {
            tokio::time::sleep(self.latency).await;
            if self.writes.fetch_add(1, Ordering::SeqCst) + 1 == self.give_up_at {
                self.flag.give_up();
            }
            Ok(None)
        }
    }

    #[async_trait]
    impl RecordStore for AlwaysRaced {
        fn describe(&self) -> String {
            "always raced".into()
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
        async fn get(&self, key: &Key) -> Result<Option<Stored>> {
            self.inner.get(key).await
        }
        async fn create(&self, _: &Key, _: &LeaseRecord) -> Result<Option<String>> {
            self.lose().await
        }
        async fn replace(&self, _: &Key, _: &LeaseRecord, _: &str) -> Result<Option<String>> {
            self.lose().await
        }
        async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
            self.inner.delete(key, version).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
            self.inner.list(prefix).await
        }
    }

    /// Acquires with a store that gives the request up at its `give_up_at`-th write (0: never);
    /// the answer and how many writes were sent.
    async fn acquire_raced(give_up_at: usize) -> (Result<AcquireOutcome>, usize) {
        let req = AcquireRequest::new(Key::new("k").unwrap(), "me", Duration::from_secs(1));
        let (raced, writes) = AlwaysRaced::new(give_up_at, req.given_up.clone(), Duration::ZERO);
        let store = RecordLockStore::new(raced);
        let res = store.acquire(&req).await;
        (res, writes.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_given_up_acquisition_stops_retrying_lost_races() {
        // Not given up: every lost race is retried, up to the limit.
        let (res, writes) = acquire_raced(0).await;
        assert!(
            matches!(
                res,
                Err(Error::Store {
                    retryable: true,
                    ..
                })
            ),
            "{res:?}"
        );
        assert_eq!(
            writes,
            MAX_RACES + 1,
            "the create first, then a read and write per race"
        );
        // Given up while its third write was out: that write is answered, no fourth is sent.
        let (res, writes) = acquire_raced(3).await;
        assert!(matches!(res, Err(Error::GivenUp { .. })), "{res:?}");
        assert_eq!(writes, 3);
    }

    #[tokio::test]
    async fn an_acquisition_given_up_before_it_starts_sends_nothing() {
        let req = AcquireRequest::new(Key::new("k").unwrap(), "me", Duration::from_secs(1));
        req.given_up.give_up();
        let (raced, writes) = AlwaysRaced::new(0, GiveUp::default(), Duration::ZERO);
        let store = RecordLockStore::new(raced);
        let res = store.acquire(&req).await;
        assert!(matches!(res, Err(Error::GivenUp { .. })), "{res:?}");
        assert_eq!(writes.load(Ordering::SeqCst), 0);
        assert!(store.inspect(&req.key).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_dropped_try_acquire_stops_its_store_call_retrying() {
        let (raced, writes) = AlwaysRaced::new(0, GiveUp::default(), Duration::from_millis(10));
        let locks = crate::Locks::new(RecordLockStore::new(raced));
        // Every race takes 10 ms: all of them would take 650 ms; the caller leaves after 30.
        let left = tokio::time::timeout(Duration::from_millis(30), async {
            locks.lock("k")?.try_acquire().await
        })
        .await;
        assert!(left.is_err(), "still retrying when dropped: {left:?}");
        assert_eq!(crate::settle(Duration::from_secs(5)).await, 0);
        let sent = writes.load(Ordering::SeqCst);
        assert!(
            (1..MAX_RACES / 2).contains(&sent),
            "the call in the background stopped at its next race: {sent} writes"
        );
    }
}
