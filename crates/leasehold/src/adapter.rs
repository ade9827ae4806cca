//! The one generic adapter from a compare-and-set [`RecordStore`] to a [`LockStore`].
//!
//! Every step is read → decide (the crate-private `decide` module) → conditional write; a write that loses the race
//! (version mismatch) re-reads and decides again, so concurrent acquirers, renewals, waiter
//! registrations and releases serialise on the record's version.
//!
//! # Expiry: observed, not compared across machines
//!
//! The `expires` time in a record is its holder's wall clock; comparing it with this machine's
//! would let a contender whose clock runs `s` ahead take a lease `s` early. So the adapter judges
//! expiry by **observation**, as Kubernetes' own leader election does: it remembers, per key, the
//! holder's part of the record (token, fence, times) and the instant on this process's monotonic
//! clock at which it first saw it. A held lease is over once that part has been seen unchanged
//! for the record's TTL plus the drift margin (1 % + 2 ms): a live holder renews well within its
//! TTL and every renewal changes that part, and the holder's own `lost()` fires at TTL − drift
//! after it sent its last renewal, before anyone could have seen that renewal. Waiter
//! registrations (which only add to a record, and do not reset the holder's part) lapse the same
//! way, after their recorded lifetime. A released record is free at once.
//!
//! # Server clocks
//!
//! Where the store reads the server's clock ([`RecordStore::server_clock`]: the object stores'
//! `Date` and `Last-Modified`), a record read for the first time, or read with a server age
//! longer than what was seen, is observed as if since that age ago
//! ([`RecordStore::get_dated`]): every part of the record was written no later than its last
//! write. No client's wall clock is then read for expiry: there is no skew shortcut, and
//! `cleanup` judges a record's age by the server's clock too.
//!
//! # The skew shortcut
//!
//! On the other stores, a contender that arrives long after a crash has seen nothing yet. It
//! either observes for one TTL (a waiting `acquire` does), or takes the **skew shortcut**: a written expiry older than
//! now − [`max_clock_skew`](RecordLockStore::with_max_clock_skew) on this machine's wall clock
//! has passed whatever the writer's clock said, as long as no two machines' clocks differ by more
//! than that bound (default [`DEFAULT_MAX_CLOCK_SKEW`], five minutes: NTP keeps clocks within
//! milliseconds, so only a broken clock comes near it). A one-shot `try_acquire` on a crashed
//! holder's lease is therefore answered "held" until TTL + the bound after the holder's last
//! renewal, unless this process has watched the record for a TTL already.
//!
//! The observation memory is bounded ([`MAX_REMEMBERED`] keys; when full it starts over, which
//! only makes a contender observe again).
//!
//! # Fences from revisions
//!
//! Where the store's versions are revisions ([`RecordStore::revisions`]: an etcd revision, a
//! store-wide write counter), fences come from them and from no clock. A grant on an existing
//! record takes the previous fence plus the block it reserves; a grant that **creates** the record
//! (first use, or after it was deleted) writes a marker and its fence is
//! `2⁵³ + revision of the create × 2²⁴ + block − 1`, resolved by whoever reads that version; the
//! creator writes it as a number right after the create (one more request, on creates only), so
//! that people reading the record see it. Every fence a write at revision `R` issues stays below
//! `2⁵³ + (R + 1) × 2²⁴` (blocks are below 2²⁴ fences), and a later create's revision is above
//! every earlier write's, deletion included: fences never go backwards, whatever the clocks say
//! and whoever deletes the record. Fences written before this scheme (microsecond clock values)
//! are below 2⁵³.
//!
//! # Fences above a deleted record's
//!
//! Other stores floor each grant's fence at this machine's wall clock in microseconds, and
//! carry it in the record from grant to grant, so it only grows while the record exists. A
//! record deleted by `cleanup` takes that memory with it, and the next creator's clock may lag
//! behind the fences it issued. So `cleanup` first raises the store's **fence high-water mark**,
//! a record of its own under [`HIGH_WATER_KEY`], to the highest fence of the records it is about
//! to delete, and a grant that creates a record (or is made on one whose fence was never floored
//! so) is written with a marker, then floored at that mark read **after** the write, and written
//! again without the marker before it is granted. A create succeeds only once the record is
//! gone, so a mark read after it sees every fence the deleted record issued, however long the
//! creator was paused before writing; a grant written meanwhile on top of a marked record does
//! the same, and the marked grant, whose confirming write then fails, is never handed out. Creates
//! cost two requests more (a read of the mark, the confirming write); every other step is as
//! before. Only deletions by `cleanup` are covered: a record deleted with the store's own tools
//! leaves the next fence to the creator's wall clock.
//!
//! # Remembered writes
//!
//! The adapter remembers the record and version of its own last successful write per key. The
//! next step on that key first decides on that record and writes conditionally on that version,
//! without reading: if nobody else wrote since, the write succeeds and a renewal, a release or a
//! re-acquisition by this process costs one request instead of two; if somebody did, the write
//! fails (version mismatch), the memory is dropped, and the step reads and decides as usual. A
//! decision that writes nothing (the lease looks held) is never taken on remembered state.

use crate::decide::{self, Current, Expiry, Now, Observed};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupReport, GiveUp, Inspection,
    LockStore, RecordStore, ReleaseOutcome, RenewOutcome, Stored,
};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// How many lost races one call tolerates before reporting the store as too contended.
const MAX_RACES: usize = 64;

/// Remembered writes and observations beyond this many keys are forgotten all at once (memory
/// stays bounded).
pub const MAX_REMEMBERED: usize = 10_000;

/// The default largest difference between two machines' wall clocks that the adapter assumes
/// (see the module documentation): five minutes.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);

/// The base of fences taken from revisions: above every microsecond clock value until the year
/// 2255, so these fences continue above the clock-floored fences of earlier records.
const REVISION_FENCE_BASE: u64 = 1 << 53;

/// Fences per revision: a block reserved by one grant stays below this.
const FENCES_PER_REVISION: u64 = 1 << 24;

/// The `store` entry marking a created record whose fence is `revision floor + fence − 1`.
const FENCE_FROM: (&str, &str) = ("fence-from", "create-revision");

/// The `store` entry marking a grant whose fence is still to be floored at the fence
/// high-water mark (see the module documentation), and so not yet handed out.
const UNCONFIRMED: (&str, &str) = ("fence-from", "high-water");

/// The key of the record that holds the store's fence high-water mark, on stores whose fences
/// do not come from revisions: a free record whose fence is at least every fence of every
/// record `cleanup` deleted. Never listed, never deleted.
pub const HIGH_WATER_KEY: &str = ".leasehold-fences";

/// Whether `record` carries a grant not yet floored at the high-water mark.
fn unconfirmed(record: &LeaseRecord) -> bool {
    record.store.get(UNCONFIRMED.0).map(String::as_str) == Some(UNCONFIRMED.1)
}

/// `write` with the unconfirmed marker of `cur` kept: a release (or a renewal) of a grant never
/// confirmed leaves its fence as unfloored as it was.
fn keep_unconfirmed(cur: Option<&Stored>, write: Option<LeaseRecord>) -> Option<LeaseRecord> {
    let mut write = write?;
    if record(cur).is_some_and(unconfirmed) {
        write
            .store
            .insert(UNCONFIRMED.0.into(), UNCONFIRMED.1.into());
    }
    Some(write)
}

/// The lowest fence a create at revision `r` issues.
fn revision_fence(r: u64) -> u64 {
    REVISION_FENCE_BASE.saturating_add(r.saturating_mul(FENCES_PER_REVISION))
}

/// The holder's part of a record: what every renewal, grant and release changes.
type LeasePart = (Option<String>, Option<String>, u64, u64, u64, u64, u64);
/// The waiter registration of a record.
type WaiterPart = (Option<String>, Option<u64>, Option<u64>);

fn lease_part(r: &LeaseRecord) -> LeasePart {
    (
        r.token.clone(),
        r.holder.clone(),
        r.fence,
        r.acquired_ms,
        r.renewed_ms,
        r.expires_ms,
        r.ttl_ms,
    )
}

fn waiter_part(r: &LeaseRecord) -> WaiterPart {
    (r.waiter_token.clone(), r.waiter_expires_ms, r.waiter_ttl_ms)
}

/// What this adapter has seen of one key, on the monotonic clock.
#[derive(Debug, Clone)]
struct Observation {
    version: String,
    lease: LeasePart,
    waiter: WaiterPart,
    lease_since: Instant,
    waiter_since: Instant,
    /// Each queued waiter's token and written expiry, and since when it has been seen so.
    queue: Vec<(String, u64, Instant)>,
}

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
    /// key → what was last seen of it, and since when.
    observed: Mutex<HashMap<String, Observation>>,
    /// The largest wall-clock difference between machines assumed.
    max_skew: Duration,
    /// Added to this machine's wall clock (tests simulating a skewed machine).
    wall_offset_ms: i64,
    /// Set once the store was seen to refuse a stale conditional delete
    /// ([`check_conditional_delete`](Self::check_conditional_delete)).
    delete_checked: tokio::sync::OnceCell<()>,
}

impl<R: RecordStore> RecordLockStore<R> {
    /// Wraps a record store, assuming clocks within [`DEFAULT_MAX_CLOCK_SKEW`].
    pub fn new(inner: R) -> Self {
        RecordLockStore {
            inner,
            written: Mutex::new(HashMap::new()),
            observed: Mutex::new(HashMap::new()),
            max_skew: DEFAULT_MAX_CLOCK_SKEW,
            wall_offset_ms: 0,
            delete_checked: tokio::sync::OnceCell::new(),
        }
    }

    /// Sets the largest difference between two machines' wall clocks this adapter assumes
    /// (default [`DEFAULT_MAX_CLOCK_SKEW`]); `?max_clock_skew=` in a store URL sets it too.
    ///
    /// # Expiry
    /// A held record whose written expiry is older than now − `skew` on this machine's wall
    /// clock is taken at first sight; any other held record only after it was seen unchanged for
    /// its TTL (see the module documentation). A larger bound makes a one-shot acquirer wait
    /// longer after a crash; a bound below the real skew between two machines lets a contender
    /// whose clock is ahead by more than the bound take a lease that is still held.
    ///
    /// ```
    /// use leasehold::{adapter::RecordLockStore, memory::RecordMemoryStore};
    /// use std::time::Duration;
    /// let store = RecordLockStore::new(RecordMemoryStore::new())
    ///     .with_max_clock_skew(Duration::from_secs(60));
    /// assert_eq!(store.max_clock_skew(), Duration::from_secs(60));
    /// ```
    pub fn with_max_clock_skew(mut self, skew: Duration) -> Self {
        self.max_skew = skew;
        self
    }

    /// The largest wall-clock difference between machines this adapter assumes.
    pub fn max_clock_skew(&self) -> Duration {
        self.max_skew
    }

    /// Makes this adapter read the wall clock `offset_ms` milliseconds off (negative: behind), as
    /// if it ran on a machine whose clock is wrong by that much. For tests of clock skew in one
    /// process; the monotonic clock it observes records on is left alone.
    pub fn with_wall_clock_offset(mut self, offset_ms: i64) -> Self {
        self.wall_offset_ms = offset_ms;
        self
    }

    /// This adapter's wall clock now.
    fn now(&self) -> Now {
        let us = crate::record::now_us().saturating_add_signed(self.wall_offset_ms * 1000);
        Now { ms: us / 1000, us }
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

    /// The retryable error of a step whose `what` lost [`MAX_RACES`] races in a row.
    fn lost_races(&self, what: &str) -> Error {
        Error::Store {
            source: None,
            store: self.inner.describe(),
            detail: format!("{MAX_RACES} {what} in a row lost their race"),
            retryable: true,
        }
    }

    /// The wrapped record store.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// A stored record with a create-revision fence marker resolved to its fence.
    fn resolve(&self, s: Stored) -> Stored {
        match s {
            Stored::Record {
                mut record,
                version,
            } => {
                self.resolve_fence(&mut record, &version);
                Stored::Record { record, version }
            }
            s => s,
        }
    }

    /// Resolves the create-revision fence marker of `record`, stored at `version`, if it has one.
    fn resolve_fence(&self, record: &mut LeaseRecord, version: &str) {
        if record.store.get(FENCE_FROM.0).map(String::as_str) != Some(FENCE_FROM.1) {
            return;
        }
        record.store.remove(FENCE_FROM.0);
        let offset = record.fence.saturating_sub(1);
        record.fence = match self.inner.revision(version) {
            Some(r) => revision_fence(r).saturating_add(offset),
            // Not a revision after all: the clock floor, as stores without revisions.
            None => record.fence.max(self.now().us),
        };
    }

    /// Records having seen `record` at `version` now; what has been seen of it, and for how long.
    fn observe(&self, key: &Key, version: &str, record: &LeaseRecord) -> Observed {
        self.observe_aged(key, version, record, None)
    }

    /// [`Self::observe`], the record having gone unwritten for at least `age` by the server's
    /// clock ([`RecordStore::get_dated`]): everything in it has then been unchanged since at least
    /// `age` ago, and its observation starts no later than that.
    fn observe_aged(
        &self,
        key: &Key,
        version: &str,
        record: &LeaseRecord,
        age: Option<Duration>,
    ) -> Observed {
        let now = Instant::now();
        let floor = age.and_then(|a| now.checked_sub(a));
        let lease = lease_part(record);
        let waiter = waiter_part(record);
        let mut all = self.observed.lock();
        if all.len() >= MAX_REMEMBERED && !all.contains_key(key.as_str()) {
            all.clear();
        }
        let o = all
            .entry(key.as_str().to_owned())
            .or_insert_with(|| Observation {
                version: version.to_owned(),
                lease: lease.clone(),
                waiter: waiter.clone(),
                lease_since: now,
                waiter_since: now,
                queue: Vec::new(),
            });
        if o.version != version {
            // Somebody wrote. A write that only set a waiter registration or changed the line
            // behind it (a waiter joining, renewing its place or leaving) leaves the holder's
            // part as it was; any other write (a renewal, even one whose times happen to be
            // equal, a release, a grant) starts the holder's observation over.
            let line_changed = record.queue.len() != o.queue.len()
                || record
                    .queue
                    .iter()
                    .zip(&o.queue)
                    .any(|(w, (t, e, _))| w.token != *t || w.expires_ms != *e);
            let waiter_write = (waiter.0.is_some() && waiter != o.waiter) || line_changed;
            if lease != o.lease || !waiter_write {
                o.lease_since = now;
            }
            if waiter != o.waiter {
                o.waiter_since = now;
            }
            o.version = version.to_owned();
            o.lease = lease;
            o.waiter = waiter;
        }
        if let Some(f) = floor {
            o.lease_since = o.lease_since.min(f);
            o.waiter_since = o.waiter_since.min(f);
        }
        // A queued place lapses once seen unchanged (its token and written expiry) for its
        // lifetime plus the drift margin; a place renewed or new is observed afresh.
        let queue: Vec<(String, u64, Instant)> = record
            .queue
            .iter()
            .map(|w| {
                let since = o
                    .queue
                    .iter()
                    .find(|(t, e, _)| *t == w.token && *e == w.expires_ms)
                    .map_or(now, |(_, _, since)| *since);
                let since = floor.map_or(since, |f| since.min(f));
                (w.token.clone(), w.expires_ms, since)
            })
            .collect();
        let mut queue_lapsed = 0u64;
        for (i, (w, (_, _, since))) in record.queue.iter().zip(&queue).enumerate().take(64) {
            if now.saturating_duration_since(*since) >= decide::observation_needed(w.ttl_ms) {
                queue_lapsed |= 1 << i;
            }
        }
        o.queue = queue;
        Observed {
            lease_unchanged: now.saturating_duration_since(o.lease_since),
            waiter_unchanged: now.saturating_duration_since(o.waiter_since),
            max_skew: self.skew_shortcut(),
            queue_lapsed,
        }
    }

    fn unobserve(&self, key: &Key) {
        self.observed.lock().remove(key.as_str());
    }

    /// The expiry rule for what `cur` holds, observing it.
    fn judge(&self, key: &Key, cur: Option<&Stored>) -> Expiry {
        self.judge_aged(key, cur, None)
    }

    /// [`Self::judge`] of a record read with its server age.
    fn judge_aged(&self, key: &Key, cur: Option<&Stored>, age: Option<Duration>) -> Expiry {
        match cur {
            Some(Stored::Record { record, version }) => {
                Expiry::Observed(self.observe_aged(key, version, record, age))
            }
            // A record that does not parse is observed by its version: a write of any kind
            // starts its observation over.
            Some(Stored::Corrupt { version, .. }) => {
                let mut marker = LeaseRecord::free(key.as_str(), 0);
                marker.token = Some(format!("corrupt at version {version}"));
                Expiry::Observed(self.observe_aged(key, version, &marker, age))
            }
            // No record (or a guess that there is none: a create tried before reading): nothing
            // to observe. What was seen of an earlier record stays until a record is seen again:
            // a different one starts its observation over.
            None => Expiry::Observed(self.first_sight()),
        }
    }

    /// The rule for a record never seen before: only the skew shortcut can end it.
    fn first_sight(&self) -> Observed {
        Observed {
            lease_unchanged: Duration::ZERO,
            waiter_unchanged: Duration::ZERO,
            max_skew: self.skew_shortcut(),
            queue_lapsed: 0,
        }
    }

    /// The skew the shortcut assumes: none is taken (an unbounded skew) on a store that reads the
    /// server's clock, where no client's wall clock decides anything.
    fn skew_shortcut(&self) -> Duration {
        if self.inner.server_clock() {
            Duration::MAX
        } else {
            self.max_skew
        }
    }

    /// Reads, decides with `f`, writes conditionally; retries lost races. Every record `f` sees
    /// has its fence resolved ([`Self::resolve`]); every record written is observed as written.
    ///
    /// With `create_first`, a key this adapter has no write of and has never seen a record of is
    /// first tried as if it had no record (one create, no read): a new key then costs one
    /// request, an existing one one more than reading first (the create is refused and the loop
    /// below reads). A key seen before is read first: under contention, where the memory of our
    /// last write is often outdated, a create would only be refused.
    ///
    /// With `given_up` (an acquisition's flag), no further request is sent once the flag is set
    /// (a lost race is not retried): the call answers [`Error::GivenUp`].
    ///
    /// Returns `f`'s answer and the record as written (resolved), if something was written.
    async fn cas<T>(
        &self,
        key: &Key,
        create_first: bool,
        given_up: Option<&GiveUp>,
        mut f: impl FnMut(Option<&Stored>) -> (T, Option<LeaseRecord>),
    ) -> Result<(T, Option<LeaseRecord>)> {
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
                        let written = self.written(key, v, write);
                        return Ok((out, Some(written)));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.forget(key);
                        return Err(e);
                    }
                }
            }
            self.forget(key);
        } else if create_first && !self.observed.lock().contains_key(key.as_str()) {
            if let (out, Some(write)) = f(None) {
                if let Some(v) = self.inner.create(key, &write).await? {
                    let written = self.written(key, v, write);
                    return Ok((out, Some(written)));
                }
            }
        }
        for _ in 0..MAX_RACES {
            if let Some(e) = stop() {
                return Err(e);
            }
            let round = Instant::now();
            let (cur, age) = match self.inner.get_dated(key).await? {
                Some((s, age)) => (Some(self.resolve(s)), age),
                None => (None, None),
            };
            if age.is_some() {
                // Observed with its server age before `f` judges it (which observes it again).
                self.judge_aged(key, cur.as_ref(), age);
            }
            let (out, write) = f(cur.as_ref());
            let Some(write) = write else {
                return Ok((out, None));
            };
            let written = match &cur {
                None => self.inner.create(key, &write).await?,
                Some(Stored::Record { version, .. }) | Some(Stored::Corrupt { version, .. }) => {
                    self.inner.replace(key, &write, version).await?
                }
            };
            if let Some(v) = written {
                let written = self.written(key, v, write);
                return Ok((out, Some(written)));
            }
            // Lost: somebody wrote between our read and our write. Wait a random part of the
            // time a read and a write take before trying again, so that a writer who writes at
            // a steady pace (a holder renewing often) cannot keep winning in step with us.
            let took = round.elapsed().as_micros() as u64;
            tokio::time::sleep(Duration::from_micros(fastrand::u64(0..=took))).await;
        }
        Err(self.lost_races(&format!("conditional writes on {key}")))
    }

    /// Writes the fence of a record this adapter just created (its create revision resolved) as a
    /// number, so that people reading the record with the store's own tools see it. The fence is
    /// defined by the create's revision either way: a write that loses its race (somebody wrote,
    /// and so stored the number) or fails changes nothing about it.
    async fn write_resolved_fence(&self, key: &Key) {
        let Some((version, record)) = self.written.lock().get(key.as_str()).cloned() else {
            return;
        };
        match self.inner.replace(key, &record, &version).await {
            Ok(Some(v)) => {
                self.written(key, v, record);
            }
            Ok(None) => self.forget(key),
            Err(e) => {
                tracing::debug!(key = %key, error = %e, "the fence of a new record stays a marker until its next write");
                self.forget(key);
            }
        }
    }

    /// Takes note of a successful write of `record` at `version`: resolved, remembered, observed.
    fn written(&self, key: &Key, version: String, mut record: LeaseRecord) -> LeaseRecord {
        self.resolve_fence(&mut record, &version);
        self.observe(key, &version, &record);
        self.remember(key, version, record.clone());
        record
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
        req.check_size(self.inner.label_limit(), &self.inner.describe())?;
        let revisions = self.inner.revisions();
        // Whether the last decision (the one written, if any) creates the record.
        let created = std::sync::atomic::AtomicBool::new(false);
        // Whether its grant is still to be floored at the fence high-water mark.
        let to_confirm = std::sync::atomic::AtomicBool::new(false);
        let (out, written) = self
            .cas(&req.key, true, Some(&req.given_up), |cur| {
                created.store(cur.is_none(), std::sync::atomic::Ordering::Relaxed);
                let confirm = !revisions
                    && match cur {
                        None | Some(Stored::Corrupt { .. }) => true,
                        Some(Stored::Record { record, .. }) => unconfirmed(record),
                    };
                to_confirm.store(confirm, std::sync::atomic::Ordering::Relaxed);
                let now = self.now();
                let expiry = self.judge(&req.key, cur);
                let current = match cur {
                    None => Current::Missing,
                    Some(Stored::Record { record, .. }) => Current::Record(record),
                    // Whoever wrote it holds nothing any more once its bytes were seen unchanged
                    // for longer than any lease lasts.
                    Some(Stored::Corrupt { salvaged_fence, .. }) => Current::Corrupt {
                        salvaged_fence: *salvaged_fence,
                        over: self.inner.corrupt_holds_nothing()
                            || matches!(expiry, Expiry::Observed(o)
                                if o.lease_unchanged >= decide::corrupt_observation(req.ttl, self.max_skew)),
                    },
                };
                let floor = if revisions { 0 } else { now.us };
                let (out, mut write) =
                    decide::acquire_judged(current, req, now, false, expiry, floor);
                if let (None, true, Some(w)) = (cur, revisions, write.as_mut()) {
                    // A create: its fence comes from the revision the create gets.
                    w.store.insert(FENCE_FROM.0.into(), FENCE_FROM.1.into());
                }
                if let (true, Some(w)) = (confirm, write.as_mut()) {
                    // Floored at the high-water mark once written, before it is handed out.
                    w.store.insert(UNCONFIRMED.0.into(), UNCONFIRMED.1.into());
                }
                (out, write)
            })
            .await?;
        Ok(match (out, written) {
            (AcquireOutcome::Granted(_), Some(_))
                if to_confirm.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                self.confirm_fence(req).await?
            }
            (AcquireOutcome::Granted(_), Some(w)) => {
                if revisions && created.load(std::sync::atomic::Ordering::Relaxed) {
                    self.write_resolved_fence(&req.key).await;
                }
                AcquireOutcome::Granted(w)
            }
            (out, _) => out,
        })
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        let ttl_ms = crate::record::ms(ttl);
        let (out, _) = self
            .cas(key, false, None, |cur| {
                let expiry = self.judge(key, cur);
                let (out, write) =
                    decide::renew_judged(record(cur), token, ttl_ms, self.now().ms, expiry);
                (out, keep_unconfirmed(cur, write))
            })
            .await?;
        Ok(out)
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        let (out, _) = self
            .cas(key, false, None, |cur| {
                let expiry = self.judge(key, cur);
                let (out, write) =
                    decide::release_judged(record(cur), token, self.now().ms, expiry);
                (out, keep_unconfirmed(cur, write))
            })
            .await?;
        Ok(out)
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        self.cas(key, false, None, |cur| {
            ((), decide::withdraw_waiter(record(cur), token))
        })
        .await?;
        Ok(())
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        Ok(self
            .inner
            .get(key)
            .await?
            .map(|s| to_inspection(key.as_str().to_owned(), self.resolve(s))))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        Ok(self
            .inner
            .list(prefix)
            .await?
            .into_iter()
            .filter(|(_, s)| !is_high_water(s))
            .map(|(n, s)| to_inspection(n, self.resolve(s)))
            .collect())
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        let (out, _) = self
            .cas(key, false, None, |cur| match record(cur) {
                Some(r) if r.token.is_some() => {
                    let expiry = self.judge(key, cur);
                    let freed = decide::freed_judged(r, self.now().ms, expiry);
                    (Some(r.clone()), keep_unconfirmed(cur, Some(freed)))
                }
                Some(r) => (Some(r.clone()), None),
                None => (None, None),
            })
            .await?;
        Ok(out)
    }

    async fn cleanup(&self, older_than: Duration) -> Result<CleanupReport> {
        self.check_conditional_delete().await?;
        let mut report = CleanupReport::default();
        let now = self.now().ms;
        let server_clock = self.inner.server_clock();
        // Judged first, deleted after the high-water mark is raised above their fences.
        let mut doomed = Vec::new();
        for (_, stored, age) in self.inner.list_dated("").await? {
            if is_high_water(&stored) {
                continue;
            }
            if let Stored::Record { record, version } = self.resolve(stored) {
                let key = Key::internal(&record.key)?;
                let removable = if server_clock {
                    // Judged on the server's clock, by the age the listing read (the delete is
                    // conditioned on that version). Without an age, nothing is judged removable.
                    age.and_then(|age| {
                        let seen = self.observe_aged(&key, &version, &record, Some(age));
                        decide::removable_aged(&record, age, older_than, seen).then_some(version)
                    })
                } else {
                    // A one-shot look: only a record free, or expired beyond any assumed skew,
                    // goes.
                    let expiry = Expiry::Observed(self.first_sight());
                    decide::removable_judged(&record, now, crate::record::ms(older_than), expiry)
                        .then_some(version)
                };
                if let Some(version) = removable {
                    doomed.push((key, version, record.fence));
                    continue;
                }
            }
            report.kept += 1;
        }
        let top = doomed.iter().map(|(_, _, fence)| *fence).max();
        if let (Some(top), false) = (top, self.inner.revisions()) {
            self.raise_high_water(top).await?;
        }
        for (key, version, _) in doomed {
            if self.inner.delete(&key, &version).await? {
                self.forget(&key);
                self.unobserve(&key);
                report.removed += 1;
            } else {
                report.kept += 1;
            }
        }
        Ok(report)
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        self.inner.subscribe(key).await
    }
}

/// The keys of the scratch records start with this: before its first delete, `cleanup` checks
/// on one that the store refuses a delete conditioned on a stale version, and deletes nothing
/// on a store that carries it out. A scratch record is free and deleted again at once; one left
/// behind (the process died meanwhile) is removed by a later `cleanup` like any free record.
pub const PROBE_PREFIX: &str = ".leasehold-probe/";

/// How many scratch records the delete check tries before it gives up on a store where each one
/// changed or vanished under it (other cleanups removing them).
const PROBE_ATTEMPTS: usize = 3;

impl<R: RecordStore> RecordLockStore<R> {
    /// Checks, once per adapter and before its first delete, that the store refuses a delete
    /// conditioned on a stale version: `cleanup` rests on it, since a record it judged removable
    /// may be granted again before its delete arrives. A server that ignores the precondition
    /// (some emulators, older S3-compatible servers) would delete the live lease.
    ///
    /// A success is kept; a failure is checked again at the next call.
    ///
    /// # Errors
    /// A non-retryable [`Error::Store`] naming the store when it carried out the stale delete;
    /// the store's errors; a retryable [`Error::Store`] when every scratch record changed or
    /// vanished before the check could conclude.
    async fn check_conditional_delete(&self) -> Result<()> {
        self.delete_checked
            .get_or_try_init(|| self.probe_conditional_delete())
            .await
            .map(|_| ())
    }

    /// Creates a scratch record under [`PROBE_PREFIX`], replaces it (new bytes, so a new version
    /// on every store, ETags as MD5s included), then deletes it conditioned on the first
    /// version: the store must refuse, and the record must still be there as replaced. The
    /// scratch record is then deleted (best effort: a free record, which any later cleanup
    /// removes).
    async fn probe_conditional_delete(&self) -> Result<()> {
        for _ in 0..PROBE_ATTEMPTS {
            let key = Key::internal(format!("{PROBE_PREFIX}{:016x}", fastrand::u64(..)))?;
            let mut record = LeaseRecord::free(key.as_str(), 0);
            record.renewed_ms = self.now().ms;
            let Some(stale) = self.inner.create(&key, &record).await? else {
                continue; // the name is taken: draw another
            };
            record.renewed_ms = record.renewed_ms.saturating_add(1);
            let Some(current) = self.inner.replace(&key, &record, &stale).await? else {
                continue; // changed under us (another cleanup removed it)
            };
            if self.inner.delete(&key, &stale).await? {
                return Err(Error::Store {
                    store: self.inner.describe(),
                    detail: format!(
                        "the server ignores the precondition on DELETE: a delete conditioned on a stale version of the scratch record {key} was carried out, so cleanup deletes nothing on this store (a cleanup racing a grant could delete a live lease)"
                    ),
                    retryable: false,
                    source: None,
                });
            }
            // A refusal proves something only if the record is still there as replaced: a
            // "not found" because another cleanup removed it meanwhile does not.
            let kept = matches!(
                self.inner.get(&key).await?,
                Some(Stored::Record { version, .. }) if version == current
            );
            // A leftover scratch record is free; any later cleanup removes it.
            let _ = self.inner.delete(&key, &current).await;
            if kept {
                return Ok(());
            }
        }
        Err(Error::Store {
            store: self.inner.describe(),
            detail: format!(
                "cannot check that the server refuses a stale conditional delete: {PROBE_ATTEMPTS} scratch records changed or vanished under the check, so cleanup deletes nothing this time"
            ),
            retryable: true,
            source: None,
        })
    }
}

/// Whether `s` is the fence high-water record.
fn is_high_water(s: &Stored) -> bool {
    matches!(s, Stored::Record { record, .. } if record.key == HIGH_WATER_KEY)
}

impl<R: RecordStore> RecordLockStore<R> {
    fn high_water_key() -> Result<Key> {
        Key::internal(HIGH_WATER_KEY)
    }

    /// The store's fence high-water mark: 0 when there is none.
    ///
    /// # Errors
    /// The store's errors; a non-retryable [`Error::Store`] when the record cannot be read and
    /// no fence can be salvaged from its bytes (no grant that needs it is made until it is
    /// repaired or deleted by hand).
    async fn high_water(&self) -> Result<u64> {
        match self.inner.get(&Self::high_water_key()?).await? {
            None => Ok(0),
            Some(Stored::Record { record, .. }) => Ok(record.fence),
            Some(Stored::Corrupt {
                salvaged_fence: Some(f),
                ..
            }) => Ok(f),
            Some(Stored::Corrupt { detail, .. }) => Err(Error::Store {
                source: None,
                store: self.inner.describe(),
                detail: format!(
                    "the fence high-water record {HIGH_WATER_KEY} cannot be read ({detail}): no lease on a new record is granted until it is repaired"
                ),
                retryable: false,
            }),
        }
    }

    /// Raises the store's fence high-water mark to at least `fence`.
    async fn raise_high_water(&self, fence: u64) -> Result<()> {
        let key = Self::high_water_key()?;
        for _ in 0..MAX_RACES {
            let done = match self.inner.get(&key).await? {
                None => {
                    let mark = LeaseRecord::free(HIGH_WATER_KEY, fence);
                    self.inner.create(&key, &mark).await?.is_some()
                }
                Some(Stored::Record { record, .. }) if record.fence >= fence => true,
                Some(Stored::Record {
                    mut record,
                    version,
                }) => {
                    record.fence = fence;
                    record.renewed_ms = self.now().ms;
                    self.inner.replace(&key, &record, &version).await?.is_some()
                }
                Some(Stored::Corrupt {
                    version,
                    salvaged_fence,
                    ..
                }) => {
                    let mark =
                        LeaseRecord::free(HIGH_WATER_KEY, fence.max(salvaged_fence.unwrap_or(0)));
                    self.inner.replace(&key, &mark, &version).await?.is_some()
                }
            };
            if done {
                return Ok(());
            }
        }
        Err(self.lost_races("writes of the fence high-water record"))
    }

    /// Floors the grant `req` just wrote (with the unconfirmed marker) at the fence high-water
    /// mark read now, and writes it again without the marker: the grant, or, when somebody
    /// else's write took the record meanwhile, what the record holds now (the marked grant was
    /// never handed out).
    async fn confirm_fence(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let key = &req.key;
        let mut state = self.written.lock().get(key.as_str()).cloned();
        for _ in 0..MAX_RACES {
            let (version, record) = match state.take() {
                Some(s) => s,
                None => match self.inner.get(key).await?.map(|s| self.resolve(s)) {
                    Some(Stored::Record { record, version }) => (version, record),
                    Some(Stored::Corrupt { salvaged_fence, .. }) => {
                        let placeholder = decide::corrupt_placeholder(
                            key.as_str(),
                            salvaged_fence.unwrap_or(0),
                            self.now().ms,
                        );
                        return Ok(AcquireOutcome::Held(placeholder));
                    }
                    None => return Ok(AcquireOutcome::Held(LeaseRecord::free(key.as_str(), 0))),
                },
            };
            if record.token.as_deref() != Some(req.token.as_str()) {
                return Ok(AcquireOutcome::Held(record));
            }
            if !unconfirmed(&record) {
                return Ok(AcquireOutcome::Granted(record));
            }
            let floor = self.high_water().await?.checked_add(req.fences.max(1));
            let Some(floor) = floor else {
                return Err(Error::Store {
                    source: None,
                    store: self.inner.describe(),
                    detail: format!("the fence high-water record {HIGH_WATER_KEY} is at the largest fence: no fence above it can be granted"),
                    retryable: false,
                });
            };
            let mut confirmed = record;
            confirmed.store.remove(UNCONFIRMED.0);
            confirmed.fence = confirmed.fence.max(floor);
            match self.inner.replace(key, &confirmed, &version).await? {
                Some(v) => {
                    let written = self.written(key, v, confirmed);
                    return Ok(AcquireOutcome::Granted(written));
                }
                // Somebody wrote (a waiter joined, or the grant was taken over): read again.
                None => self.forget(key),
            }
        }
        Err(self.lost_races(&format!("conditional writes on {key}")))
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

    /// Several machines sharing one record store, each with its own wall-clock error.
    fn machines(
        offsets_ms: &[i64],
    ) -> (
        Arc<RecordMemoryStore>,
        Vec<RecordLockStore<Arc<RecordMemoryStore>>>,
    ) {
        let shared = Arc::new(RecordMemoryStore::new());
        let all = offsets_ms
            .iter()
            .map(|o| RecordLockStore::new(shared.clone()).with_wall_clock_offset(*o))
            .collect();
        (shared, all)
    }

    fn request(key: &Key, holder: &str, ttl: Duration) -> AcquireRequest {
        AcquireRequest::new(key.clone(), holder, ttl)
    }

    /// A record that cannot be read is held by "unknown (corrupt record)" until its damaged bytes
    /// were seen unchanged for longer than any lease lasts (the skew bound, or the contender's TTL
    /// if longer); new damage starts the observation over.
    #[tokio::test(start_paused = true)]
    async fn a_corrupt_record_is_held_until_seen_unchanged_beyond_any_lease() {
        let (shared, m) = machines(&[0]);
        let key = Key::new("torn").unwrap();
        let req = request(&key, "a", Duration::from_secs(1));
        shared.put_raw(&key, br#"{"fence": 77, "hold"#);
        let held_by_unknown = |out: AcquireOutcome| match out {
            AcquireOutcome::Held(r) => r.holder.as_deref() == Some(decide::CORRUPT_HOLDER),
            _ => false,
        };
        assert!(held_by_unknown(m[0].acquire(&req).await.unwrap()));
        let needed = decide::corrupt_observation(req.ttl, DEFAULT_MAX_CLOCK_SKEW);
        tokio::time::advance(needed - Duration::from_secs(1)).await;
        assert!(held_by_unknown(m[0].acquire(&req).await.unwrap()));
        // Damaged again (someone still writes it): observed afresh.
        shared.put_raw(&key, br#"{"fence": 78, "hold"#);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(held_by_unknown(m[0].acquire(&req).await.unwrap()));
        tokio::time::advance(needed).await;
        let AcquireOutcome::Granted(r) = m[0].acquire(&req).await.unwrap() else {
            panic!("never recovered")
        };
        assert!(r.fence > 78);
    }

    const TWO_MINUTES: i64 = 120_000;

    /// Exclusion with clocks minutes apart: a contender whose wall clock is two minutes ahead (or
    /// behind) never takes a lease its holder keeps renewing, and takes a crashed holder's lease
    /// once it has seen it unchanged for the TTL plus the drift margin — not before, and within
    /// one poll after.
    #[tokio::test(start_paused = true)]
    async fn skewed_contenders_neither_take_a_held_lease_early_nor_wait_for_their_clock() {
        let (_, m) = machines(&[0, TWO_MINUTES, -TWO_MINUTES]);
        let (holder, ahead, behind) = (&m[0], &m[1], &m[2]);
        let key = Key::new("skew").unwrap();
        let ttl = Duration::from_secs(1);
        let h = request(&key, "holder", ttl);
        let AcquireOutcome::Granted(first) = holder.acquire(&h).await.unwrap() else {
            panic!("free key not granted")
        };
        let (a, b) = (request(&key, "ahead", ttl), request(&key, "behind", ttl));
        // The holder renews every TTL/3 for three TTLs; both contenders poll every 50 ms.
        let step = Duration::from_millis(50);
        let mut since_renewal = Duration::ZERO;
        for _ in 0..60 {
            for (who, r) in [(ahead, &a), (behind, &b)] {
                let out = who.acquire(r).await.unwrap();
                assert!(
                    matches!(out, AcquireOutcome::Held(_)),
                    "{} took a lease that is renewed every {:?}: {out:?}",
                    r.holder,
                    ttl / 3
                );
            }
            tokio::time::advance(step).await;
            since_renewal += step;
            if since_renewal >= ttl / 3 {
                let renewed = holder.renew(&key, &h.token, ttl).await.unwrap();
                assert!(matches!(renewed, RenewOutcome::Renewed(_)), "{renewed:?}");
                since_renewal = Duration::ZERO;
            }
        }
        // The holder crashes now (it renewed `since_renewal` ago); the contenders keep polling.
        let needed = decide::observation_needed(crate::record::ms(ttl));
        let crashed = Instant::now();
        let mut elapsed = since_renewal;
        let granted = loop {
            let mut got = None;
            for (who, r) in [(behind, &b), (ahead, &a)] {
                if let AcquireOutcome::Granted(g) = who.acquire(r).await.unwrap() {
                    got = Some(g);
                    break;
                }
            }
            if let Some(g) = got {
                break g;
            }
            assert!(
                elapsed <= needed + step,
                "a crashed holder's lease was still not taken {elapsed:?} after its last renewal"
            );
            tokio::time::advance(step).await;
            elapsed += step;
        };
        assert!(
            elapsed >= needed,
            "taken {elapsed:?} after the last renewal, before TTL + drift ({needed:?})"
        );
        assert!(crashed.elapsed() <= needed + step);
        assert!(granted.fence > first.fence);
    }

    /// Fences from revisions: the record is deleted (an operator, `cleanup`) after a machine
    /// whose clock runs two minutes ahead held it; the next machine's clock lags two minutes.
    /// Its fence is still above every earlier one.
    #[tokio::test]
    async fn fences_never_go_backwards_when_the_record_is_deleted_and_the_next_clock_lags() {
        let (shared, m) = machines(&[TWO_MINUTES, -TWO_MINUTES]);
        let key = Key::new("deleted").unwrap();
        let ttl = Duration::from_secs(30);
        let mut last = 0;
        for round in 0..3 {
            for (i, who) in m.iter().enumerate() {
                let r = request(&key, &format!("m{i}"), ttl);
                let AcquireOutcome::Granted(g) = who.acquire(&r).await.unwrap() else {
                    panic!("round {round}: machine {i} was refused a free key")
                };
                assert!(
                    g.fence > last,
                    "round {round}: machine {i} got fence {} after {last}",
                    g.fence
                );
                last = g.fence;
                assert_eq!(
                    who.release(&key, &r.token).await.unwrap(),
                    ReleaseOutcome::Released
                );
                // Somebody deletes the record.
                let Some(Stored::Record { version, .. }) = shared.get(&key).await.unwrap() else {
                    panic!("no record")
                };
                assert!(shared.delete(&key, &version).await.unwrap());
            }
        }
    }

    /// A waiter registration is judged by observation too: a waiter whose clock runs two
    /// minutes ahead registers and goes away; the freed lease is reserved for it only for its
    /// registration's lifetime (plus the drift margin), not for two minutes more.
    #[tokio::test(start_paused = true)]
    async fn a_vanished_waiter_with_a_fast_clock_reserves_the_lease_only_for_its_lifetime() {
        let (_, m) = machines(&[0, TWO_MINUTES, 0]);
        let (holder, waiter, other) = (&m[0], &m[1], &m[2]);
        let key = Key::new("reserved").unwrap();
        let ttl = Duration::from_secs(30);
        let h = request(&key, "holder", ttl);
        holder.acquire(&h).await.unwrap();
        let mut w = request(&key, "waiter", ttl);
        let lifetime = Duration::from_millis(300);
        w.waiter_ttl = Some(lifetime);
        let AcquireOutcome::Held(reg) = waiter.acquire(&w).await.unwrap() else {
            panic!("not held")
        };
        assert_eq!(reg.waiter_ttl_ms, Some(300));
        // The waiter is gone; the holder releases.
        assert_eq!(
            holder.release(&key, &h.token).await.unwrap(),
            ReleaseOutcome::Released
        );
        let o = request(&key, "other", ttl);
        assert!(
            matches!(other.acquire(&o).await.unwrap(), AcquireOutcome::Held(_)),
            "reserved for the waiter while its registration lives"
        );
        tokio::time::advance(decide::observation_needed(300)).await;
        let out = other.acquire(&o).await.unwrap();
        assert!(
            matches!(out, AcquireOutcome::Granted(_)),
            "still reserved for a waiter gone {lifetime:?} ago: {out:?}"
        );
    }

    /// Waiters joining the line behind a crashed holder's lease write the record, but do not
    /// renew the lease: it is taken once the holder's part was seen unchanged for the TTL plus
    /// the drift margin, however much the line changed meanwhile.
    #[tokio::test(start_paused = true)]
    async fn waiters_joining_the_line_do_not_keep_a_crashed_holders_lease_alive() {
        let (_, m) = machines(&[0, 0, 0, 0]);
        let key = Key::new("crashed").unwrap();
        let ttl = Duration::from_secs(1);
        m[0].acquire(&request(&key, "crashed", ttl)).await.unwrap();
        let waiting = |who: &str| {
            let mut r = request(&key, who, ttl);
            r.waiter_ttl = Some(Duration::from_secs(30));
            r
        };
        let first = waiting("first");
        assert!(matches!(
            m[1].acquire(&first).await.unwrap(),
            AcquireOutcome::Held(_)
        ));
        for (i, who) in ["second", "third"].into_iter().enumerate() {
            tokio::time::advance(Duration::from_millis(400)).await;
            let AcquireOutcome::Held(rec) = m[2 + i].acquire(&waiting(who)).await.unwrap() else {
                panic!("not held")
            };
            assert_eq!(rec.queue.len(), i + 1);
        }
        tokio::time::advance(decide::observation_needed(1000) - Duration::from_millis(800)).await;
        let out = m[1].acquire(&first).await.unwrap();
        assert!(
            matches!(out, AcquireOutcome::Granted(_)),
            "the line's writes kept a crashed holder's lease alive: {out:?}"
        );
    }

    /// A queued waiter whose clock runs two minutes ahead vanishes: its place lapses after its
    /// lifetime (plus the drift margin) as the holder's adapter sees it, not two minutes later,
    /// and the waiter behind it is served next.
    #[tokio::test(start_paused = true)]
    async fn a_vanished_queued_waiter_with_a_fast_clock_holds_the_line_only_for_its_lifetime() {
        let (_, m) = machines(&[0, 0, TWO_MINUTES, 0]);
        let (holder, first, gone, last) = (&m[0], &m[1], &m[2], &m[3]);
        let key = Key::new("line").unwrap();
        let ttl = Duration::from_secs(30);
        let h = request(&key, "holder", ttl);
        holder.acquire(&h).await.unwrap();
        let waiting = |who: &str, lifetime_ms: u64| {
            let mut r = request(&key, who, ttl);
            r.waiter_ttl = Some(Duration::from_millis(lifetime_ms));
            r
        };
        // "first" and "last" stay (their places live 30 s); "gone" vanishes (300 ms).
        let (w1, w2, w3) = (
            waiting("first", 30_000),
            waiting("gone", 300),
            waiting("last", 30_000),
        );
        for (who, r, place) in [(first, &w1, 0), (gone, &w2, 1), (last, &w3, 2)] {
            let AcquireOutcome::Held(rec) = who.acquire(r).await.unwrap() else {
                panic!("not held")
            };
            assert_eq!(decide::position(&rec, &r.token), Some(place));
        }
        // The holder renews: everybody still stands in line.
        let RenewOutcome::Renewed(rec) = holder.renew(&key, &h.token, ttl).await.unwrap() else {
            panic!("not renewed")
        };
        assert_eq!(rec.queue.len(), 2);
        tokio::time::advance(decide::observation_needed(300)).await;
        let RenewOutcome::Renewed(rec) = holder.renew(&key, &h.token, ttl).await.unwrap() else {
            panic!("not renewed")
        };
        assert_eq!(decide::position(&rec, &w2.token), None, "{rec:?}");
        assert_eq!(decide::position(&rec, &w3.token), Some(1));
        // Released: reserved for "first", then "last" is next, not "gone".
        holder.release(&key, &h.token).await.unwrap();
        assert!(matches!(
            gone.acquire(&w2).await.unwrap(),
            AcquireOutcome::Held(_)
        ));
        let AcquireOutcome::Granted(g) = first.acquire(&w1).await.unwrap() else {
            panic!("the first in line was not served")
        };
        assert_eq!(decide::position(&g, &w3.token), Some(0));
    }

    /// A contender arriving long after a crash, without having watched: held on first sight
    /// unless the written expiry is older than its clock minus the skew bound.
    #[tokio::test]
    async fn first_sight_takes_only_what_expired_beyond_the_skew_bound() {
        let shared = Arc::new(RecordMemoryStore::new());
        let bound = Duration::from_secs(60);
        let crashed = RecordLockStore::new(shared.clone());
        let key = Key::new("late").unwrap();
        let ttl = Duration::from_millis(100);
        crashed
            .acquire(&request(&key, "crashed", ttl))
            .await
            .unwrap();
        // Ten seconds later on this clock: expired by the holder's time, within the bound.
        let soon = RecordLockStore::new(shared.clone())
            .with_max_clock_skew(bound)
            .with_wall_clock_offset(10_000);
        assert!(matches!(
            soon.acquire(&request(&key, "soon", ttl)).await.unwrap(),
            AcquireOutcome::Held(_)
        ));
        // Beyond the bound: taken at first sight.
        let late = RecordLockStore::new(shared)
            .with_max_clock_skew(bound)
            .with_wall_clock_offset(61_000);
        assert!(matches!(
            late.acquire(&request(&key, "late", ttl)).await.unwrap(),
            AcquireOutcome::Granted(_)
        ));
    }

    /// A record store whose delete, while `ignore` is set, ignores the version it is given (as
    /// fake-gcs-server does); it counts its creates.
    #[derive(Debug, Default)]
    struct IgnoresDeleteVersion {
        inner: RecordMemoryStore,
        ignore: std::sync::atomic::AtomicBool,
        creates: AtomicUsize,
    }

    #[async_trait]
    impl RecordStore for IgnoresDeleteVersion {
        fn describe(&self) -> String {
            "ignores-delete-version://".into()
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
        async fn get(&self, key: &Key) -> Result<Option<Stored>> {
            self.inner.get(key).await
        }
        async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>> {
            self.creates.fetch_add(1, Ordering::SeqCst);
            self.inner.create(key, record).await
        }
        async fn replace(&self, k: &Key, r: &LeaseRecord, v: &str) -> Result<Option<String>> {
            self.inner.replace(k, r, v).await
        }
        async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
            if !self.ignore.load(Ordering::SeqCst) {
                return self.inner.delete(key, version).await;
            }
            match self.inner.get(key).await? {
                Some(Stored::Record { version, .. } | Stored::Corrupt { version, .. }) => {
                    self.inner.delete(key, &version).await
                }
                None => Ok(false),
            }
        }
        async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
            self.inner.list(prefix).await
        }
    }

    /// The keys of every record of `store`.
    async fn keys<R: RecordStore>(store: &RecordLockStore<R>) -> Vec<String> {
        let mut keys: Vec<String> = (store.list("").await.unwrap().into_iter())
            .map(|i| match i {
                Inspection::Record(r) => r.key,
                Inspection::Corrupt { name, .. } => name,
            })
            .collect();
        keys.sort();
        keys
    }

    /// A store that carries out a delete conditioned on a stale version: cleanup deletes
    /// nothing, naming the store and why; once the store refuses such deletes, cleanup works,
    /// leaves no scratch record, and does not check again.
    #[tokio::test]
    async fn cleanup_deletes_nothing_where_a_stale_conditional_delete_is_carried_out() {
        let store = RecordLockStore::new(IgnoresDeleteVersion::default());
        store.inner().ignore.store(true, Ordering::SeqCst);
        let ttl = Duration::from_secs(30);
        let held = Key::new("held").unwrap();
        let freed = Key::new("freed").unwrap();
        store.acquire(&request(&held, "a", ttl)).await.unwrap();
        let AcquireOutcome::Granted(r) = store.acquire(&request(&freed, "a", ttl)).await.unwrap()
        else {
            panic!("not granted")
        };
        let token = r.token.unwrap_or_default();
        store.release(&freed, &token).await.unwrap();
        let before = keys(&store).await;
        assert_eq!(before, ["freed", "held"]);

        for _ in 0..2 {
            let err = store.cleanup(Duration::ZERO).await.unwrap_err();
            assert!(
                matches!(
                    &err,
                    Error::Store {
                        retryable: false,
                        ..
                    }
                ),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(
                text.contains("ignores-delete-version://")
                    && text.contains("ignores the precondition on DELETE")
                    && text.contains("deletes nothing"),
                "{text}"
            );
            assert_eq!(keys(&store).await, before, "nothing deleted");
        }
        assert_eq!(
            store.inner().creates.load(Ordering::SeqCst),
            2 + 2,
            "checked each time"
        );

        // The store refuses stale deletes now: cleanup removes the free record only.
        store.inner().ignore.store(false, Ordering::SeqCst);
        let report = store.cleanup(Duration::ZERO).await.unwrap();
        assert_eq!((report.removed, report.kept), (1, 1), "{report:?}");
        assert_eq!(keys(&store).await, ["held"], "no scratch record left");
        store.cleanup(Duration::ZERO).await.unwrap();
        assert_eq!(
            store.inner().creates.load(Ordering::SeqCst),
            2 + 3 + 1,
            "a success is kept (the other create: the fence high-water mark's)"
        );
    }

    /// Over the plain in-memory record store, cleanup passes the check and leaves no scratch
    /// record behind.
    #[tokio::test]
    async fn cleanup_checks_the_memory_store_and_leaves_no_scratch_record() {
        let store = RecordLockStore::new(RecordMemoryStore::new());
        let key = Key::new("k").unwrap();
        let AcquireOutcome::Granted(r) = store
            .acquire(&request(&key, "a", Duration::from_secs(1)))
            .await
            .unwrap()
        else {
            panic!("not granted")
        };
        store
            .release(&key, &r.token.unwrap_or_default())
            .await
            .unwrap();
        let report = store.cleanup(Duration::ZERO).await.unwrap();
        assert_eq!((report.removed, report.kept), (1, 0), "{report:?}");
        assert!(keys(&store).await.is_empty());
    }

    /// A record store without revisions (fences floored at the clock and the high-water mark),
    /// over a shared memory store, that can hold one request of a kind until the test lets it
    /// go: `create` of any key, or the read of the high-water record.
    #[derive(Debug)]
    struct Gated {
        inner: Arc<RecordMemoryStore>,
        create_gate: parking_lot::Mutex<Option<Gate>>,
        mark_gate: parking_lot::Mutex<Option<Gate>>,
    }

    /// Says it was reached, then waits to be let go.
    #[derive(Debug)]
    struct Gate {
        reached: tokio::sync::oneshot::Sender<()>,
        go: tokio::sync::oneshot::Receiver<()>,
    }

    /// A gate, the receiver of its "reached", and the sender that lets it go.
    fn gate() -> (
        Gate,
        tokio::sync::oneshot::Receiver<()>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (reached, reached_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go) = tokio::sync::oneshot::channel();
        (Gate { reached, go }, reached_rx, go_tx)
    }

    impl Gated {
        fn new(inner: Arc<RecordMemoryStore>) -> Self {
            Gated {
                inner,
                create_gate: parking_lot::Mutex::new(None),
                mark_gate: parking_lot::Mutex::new(None),
            }
        }

        async fn pass(gate: &parking_lot::Mutex<Option<Gate>>) {
            let taken = gate.lock().take();
            if let Some(g) = taken {
                let _ = g.reached.send(());
                let _ = g.go.await;
            }
        }
    }

    #[async_trait]
    impl RecordStore for Gated {
        fn describe(&self) -> String {
            "gated memory".into()
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }
        async fn get(&self, key: &Key) -> Result<Option<Stored>> {
            if key.as_str() == HIGH_WATER_KEY {
                Self::pass(&self.mark_gate).await;
            }
            self.inner.get(key).await
        }
        async fn create(&self, key: &Key, r: &LeaseRecord) -> Result<Option<String>> {
            Self::pass(&self.create_gate).await;
            self.inner.create(key, r).await
        }
        async fn replace(&self, key: &Key, r: &LeaseRecord, v: &str) -> Result<Option<String>> {
            self.inner.replace(key, r, v).await
        }
        async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
            self.inner.delete(key, version).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
            self.inner.list(prefix).await
        }
    }

    /// Machines without revisions on one shared store, each with its wall clock off by the
    /// given offset.
    fn clocked_machines(
        offsets_ms: &[i64],
    ) -> (Arc<RecordMemoryStore>, Vec<Arc<RecordLockStore<Gated>>>) {
        let shared = Arc::new(RecordMemoryStore::new());
        let all = offsets_ms
            .iter()
            .map(|o| {
                Arc::new(
                    RecordLockStore::new(Gated::new(shared.clone())).with_wall_clock_offset(*o),
                )
            })
            .collect();
        (shared, all)
    }

    /// A grant and release of `key` by `who`: the fence.
    async fn take_and_release(who: &RecordLockStore<Gated>, key: &Key, name: &str) -> u64 {
        let r = request(key, name, Duration::from_secs(30));
        let AcquireOutcome::Granted(g) = who.acquire(&r).await.unwrap() else {
            panic!("{name} was refused a free key")
        };
        assert_eq!(
            who.release(key, &r.token).await.unwrap(),
            ReleaseOutcome::Released
        );
        g.fence
    }

    /// Without revisions, fences are floored at the clock: a record deleted by `cleanup` after
    /// a machine an hour ahead held it is created again by a machine an hour behind, whose
    /// fence is still above every earlier one (the high-water mark `cleanup` raised).
    #[tokio::test]
    async fn without_revisions_fences_stay_above_what_cleanup_deleted_when_the_next_clock_lags() {
        const HOUR: i64 = 3_600_000;
        let (_, m) = clocked_machines(&[HOUR, -HOUR]);
        let key = Key::new("cleaned").unwrap();
        let mut last = 0;
        for round in 0..3 {
            for (i, who) in m.iter().enumerate() {
                let fence = take_and_release(who, &key, &format!("m{i}")).await;
                assert!(
                    fence > last,
                    "round {round}: machine {i} got fence {fence} after {last}, the record having been deleted by cleanup"
                );
                last = fence;
                let report = who.cleanup(Duration::ZERO).await.unwrap();
                assert_eq!(report.removed, 1, "round {round}: {report:?}");
                let listed = who.list("").await.unwrap();
                assert!(listed.is_empty(), "the mark is never listed: {listed:?}");
            }
        }
        assert!(
            Key::new(HIGH_WATER_KEY).is_err(),
            "no user key can name the mark"
        );
    }

    /// A create held up (a paused process) while the key is created, granted, released and
    /// cleaned up by a machine an hour ahead: the held-up grant, an hour behind, is floored at
    /// the mark read after its create went through, above every fence the deleted record
    /// issued. (A mark read before the create would have missed that cleanup.)
    #[tokio::test]
    async fn a_create_held_up_across_a_cleanup_is_fenced_above_what_it_deleted() {
        const HOUR: i64 = 3_600_000;
        let (_, m) = clocked_machines(&[HOUR, -HOUR]);
        let (ahead, behind) = (m[0].clone(), m[1].clone());
        let key = Key::new("held-up").unwrap();
        let (g, reached, go) = gate();
        *behind.inner().create_gate.lock() = Some(g);
        let slow = tokio::spawn({
            let (behind, key) = (behind.clone(), key.clone());
            async move {
                let r = request(&key, "behind", Duration::from_secs(30));
                behind.acquire(&r).await.unwrap()
            }
        });
        reached.await.unwrap();
        let deleted = take_and_release(&ahead, &key, "ahead").await;
        assert_eq!(ahead.cleanup(Duration::ZERO).await.unwrap().removed, 1);
        go.send(()).unwrap();
        let AcquireOutcome::Granted(g) = slow.await.unwrap() else {
            panic!("the held-up create was refused a free key")
        };
        assert!(
            g.fence > deleted,
            "the held-up create got fence {} after {deleted} was granted and cleaned up",
            g.fence
        );
        assert!(!unconfirmed(&g), "handed out unconfirmed: {g:?}");
    }

    /// A grant written but not yet floored at the mark (its process paused before reading it)
    /// is taken over once it expires: the taker floors its own grant at the mark, above what
    /// cleanup deleted, and the paused grant, whose confirming write then fails, is never handed
    /// out.
    #[tokio::test(start_paused = true)]
    async fn a_grant_never_confirmed_is_taken_over_above_the_mark_and_never_handed_out() {
        const HOUR: i64 = 3_600_000;
        let (_, m) = clocked_machines(&[HOUR, -HOUR, -HOUR]);
        let (ahead, paused, taker) = (m[0].clone(), m[1].clone(), m[2].clone());
        let key = Key::new("unconfirmed").unwrap();
        let deleted = take_and_release(&ahead, &key, "ahead").await;
        assert_eq!(ahead.cleanup(Duration::ZERO).await.unwrap().removed, 1);
        let ttl = Duration::from_secs(1);
        let (g, reached, go) = gate();
        *paused.inner().mark_gate.lock() = Some(g);
        let stuck = tokio::spawn({
            let (paused, key) = (paused.clone(), key.clone());
            async move { paused.acquire(&request(&key, "paused", ttl)).await.unwrap() }
        });
        reached.await.unwrap();
        let t = request(&key, "taker", ttl);
        let taken = loop {
            if let AcquireOutcome::Granted(g) = taker.acquire(&t).await.unwrap() {
                break g;
            }
            tokio::time::advance(Duration::from_millis(100)).await;
        };
        assert!(
            taken.fence > deleted,
            "the taker got fence {} after {deleted} was granted and cleaned up",
            taken.fence
        );
        go.send(()).unwrap();
        let out = stuck.await.unwrap();
        assert!(
            matches!(&out, AcquireOutcome::Held(r) if r.token == taken.token),
            "the paused grant was handed out after it was taken over: {out:?}"
        );
    }
}
