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

use self::cleanup::is_high_water;
use crate::decide::{self, Current, Expiry, Now, Observed, Rules};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    GiveUp, Inspection, LockStore, RecordStore, RecordStoreOptions, ReleaseOutcome, RenewOutcome,
    StoreOptions, Stored,
};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

mod cleanup;

pub use cleanup::PROBE_PREFIX;

/// How many lost races one call tolerates before reporting the store as too contended.
const MAX_RACES: usize = 64;

/// Remembered writes and observations beyond this many keys are forgotten all at once (memory
/// stays bounded).
pub const MAX_REMEMBERED: usize = 10_000;

pub use crate::options::DEFAULT_MAX_CLOCK_SKEW;

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

/// Whether `cur` is a record still to be floored at the high-water mark.
fn unconfirmed_record(cur: Option<&Stored>) -> bool {
    matches!(cur, Some(Stored::Record { record, .. }) if unconfirmed(record))
}

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
    queue: Vec<Seen>,
    /// Each permit holder's token and written expiry, and since when it has been seen so.
    permits: Vec<Seen>,
}

/// An entry of a record (a place in line, a permit): its token and written expiry, and since
/// when it has been seen so.
type Seen = (String, u64, Instant);

/// What is seen of a record's entries (token, written expiry, lifetime in ms) now, given what
/// was seen of them before (`floor`: the record's server age, observed since no later than
/// that), and bit `i` set for each entry `i` seen unchanged for its lifetime plus the drift.
fn entries_seen<'a>(
    before: &[Seen],
    entries: impl Iterator<Item = (&'a str, u64, u64)>,
    now: Instant,
    floor: Option<Instant>,
) -> (Vec<Seen>, u64) {
    let mut lapsed = 0u64;
    let seen = entries
        .enumerate()
        .map(|(i, (token, expires, ttl_ms))| {
            let since = before
                .iter()
                .find(|(t, e, _)| t == token && *e == expires)
                .map_or(now, |(_, _, since)| *since);
            let since = floor.map_or(since, |f| since.min(f));
            if i < 64 && now.saturating_duration_since(since) >= decide::observation_needed(ttl_ms)
            {
                lapsed |= 1 << i;
            }
            (token.to_owned(), expires, since)
        })
        .collect();
    (seen, lapsed)
}

/// Every store of records opens through the adapter: its options' store, wrapped with their
/// `max_clock_skew`.
impl<O: RecordStoreOptions> StoreOptions for O {
    const OPTION_IS_URL_ERROR: bool = <O as RecordStoreOptions>::OPTION_IS_URL_ERROR;

    fn from_url(url: &str) -> Result<Self> {
        <O as RecordStoreOptions>::from_url(url)
    }

    async fn connect(self) -> Result<std::sync::Arc<dyn LockStore>> {
        let skew = self.max_clock_skew();
        let store = RecordStoreOptions::connect(self).await?;
        Ok(std::sync::Arc::new(
            RecordLockStore::new(store).with_max_clock_skew(skew),
        ))
    }

    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        let mut durations = RecordStoreOptions::checked(self)?;
        durations.push(self.max_clock_skew());
        Ok(durations)
    }
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
                permits: Vec::new(),
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
        // A queued place, or a permit, lapses once seen unchanged (its token and written
        // expiry) for its lifetime plus the drift margin; one renewed or new is observed afresh.
        let queue = record
            .queue
            .iter()
            .map(|w| (w.token.as_str(), w.expires_ms, w.ttl_ms));
        let (queue, queue_lapsed) = entries_seen(&o.queue, queue, now, floor);
        o.queue = queue;
        let permits = record.permits.iter().flat_map(|t| &t.holders);
        let permits = permits.map(|p| (p.token.as_str(), p.expires_ms, p.ttl_ms));
        let (permits, permits_lapsed) = entries_seen(&o.permits, permits, now, floor);
        o.permits = permits;
        Observed {
            lease_unchanged: now.saturating_duration_since(o.lease_since),
            waiter_unchanged: now.saturating_duration_since(o.waiter_since),
            max_skew: self.skew_shortcut(),
            queue_lapsed,
            permits_lapsed,
        }
    }

    fn unobserve(&self, key: &Key) {
        self.observed.lock().remove(key.as_str());
    }

    /// The expiry rule for what `cur` holds, observing it.
    fn judge(&self, key: &Key, cur: Option<&Stored>) -> Expiry {
        self.judge_aged(key, cur, None)
    }

    /// The rules a renewal, a release or a withdrawal of `key` is decided by, `cur` as read now.
    /// A release grants the lease to the first in line: its fence is floored as an
    /// acquisition's is (at the wall clock, on a store whose fences do not come from
    /// revisions), and a grant on a record never floored at the high-water mark stays marked so
    /// (see [`keep_unconfirmed`]) until its claim floors it.
    fn rules(&self, key: &Key, cur: Option<&Stored>) -> Rules {
        let now = self.now();
        Rules {
            now,
            expiry: self.judge(key, cur),
            fence_floor: if self.inner.revisions() { 0 } else { now.us },
        }
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
            permits_lapsed: 0,
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

    /// What a decision sees under a key as read (`cur`) by a request of `ttl`: a record that does
    /// not parse holds nothing any more once its bytes were seen unchanged for longer than any
    /// lease lasts.
    fn current<'a>(&self, cur: Option<&'a Stored>, ttl: Duration, expiry: Expiry) -> Current<'a> {
        match cur {
            None => Current::Missing,
            Some(Stored::Record { record, .. }) => Current::Record(record),
            Some(Stored::Corrupt { salvaged_fence, .. }) => Current::Corrupt {
                salvaged_fence: *salvaged_fence,
                over: self.inner.corrupt_holds_nothing()
                    || matches!(expiry, Expiry::Observed(o)
                        if o.lease_unchanged >= decide::corrupt_observation(ttl, self.max_skew)),
            },
        }
    }

    /// What an operator's release of `who` (everybody when `None`) writes on `cur`, with the
    /// record as it was.
    fn force_freed(
        &self,
        key: &Key,
        cur: Option<&Stored>,
        who: Option<&str>,
    ) -> (Option<LeaseRecord>, Option<LeaseRecord>) {
        let Some(r) = record(cur) else {
            return (None, None);
        };
        let expiry = self.judge(key, cur);
        let freed = decide::force_freed(r, who, self.now().ms, expiry);
        (Some(r.clone()), keep_unconfirmed(cur, freed))
    }

    /// A permit acquisition. Permits are granted only on a **settled** record, one whose fence
    /// no deletion can have lowered: a key with no record (or a damaged one that holds nothing)
    /// is first written free, fenced as a create is (from the write's revision, or floored at
    /// the high-water mark read after the write), and then granted in a second write. Each
    /// permit's fence is then the key's previous fence plus one.
    async fn acquire_permit(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let revisions = self.inner.revisions();
        for _ in 0..MAX_RACES {
            let (step, written) = self
                .cas(&req.key, true, Some(&req.given_up), |cur| {
                    let now = self.now();
                    let expiry = self.judge(&req.key, cur);
                    let current = self.current(cur, req.ttl, expiry);
                    let settle = match (cur, current) {
                        (None, _) | (_, Current::Corrupt { over: true, .. }) => true,
                        (Some(Stored::Record { record, .. }), _) => {
                            unconfirmed(record)
                                && (record.permits.is_some() || !expiry.held(record, now.ms))
                        }
                        _ => false,
                    };
                    if !settle {
                        let floor = if revisions { 0 } else { now.us };
                        let rules = Rules {
                            now,
                            expiry,
                            fence_floor: floor,
                        };
                        return match rules.acquire(current, req, false) {
                            Ok(d) => (Ok(Some(d.outcome)), d.write),
                            Err(e) => (Err(e), None),
                        };
                    }
                    let mut free = match (cur, current) {
                        (Some(Stored::Record { record, .. }), _) => record.clone(),
                        (_, Current::Corrupt { salvaged_fence, .. }) => {
                            LeaseRecord::free(req.key.as_str(), salvaged_fence.unwrap_or(0))
                        }
                        _ => LeaseRecord::free(req.key.as_str(), 0),
                    };
                    if revisions {
                        // Its fence is the revision of this write's (see the module docs).
                        free.fence = 1;
                        free.store.insert(FENCE_FROM.0.into(), FENCE_FROM.1.into());
                    } else {
                        free.fence = free.fence.max(now.us);
                        free.store
                            .insert(UNCONFIRMED.0.into(), UNCONFIRMED.1.into());
                    }
                    (Ok(None), (!unconfirmed_record(cur)).then_some(free))
                })
                .await?;
            match step? {
                Some(out) => return Ok(out),
                None if revisions => {
                    if written.is_some() {
                        self.write_resolved_fence(&req.key).await;
                    }
                }
                None => self.confirm_free(&req.key).await?,
            }
        }
        Err(self.lost_races(&format!("settling the record of {}", req.key)))
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

    fn floor(&self) -> Option<std::sync::Arc<dyn crate::floor::Floor>> {
        self.inner.floor()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        req.check_size(self.inner.label_limit(), &self.inner.describe())?;
        if req.permit.is_some() {
            return self.acquire_permit(req).await;
        }
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
                let current = self.current(cur, req.ttl, expiry);
                let floor = if revisions { 0 } else { now.us };
                let rules = Rules {
                    now,
                    expiry,
                    fence_floor: floor,
                };
                let (out, mut write) = match rules.acquire(current, req, false) {
                    Ok(d) => (d.outcome, d.write),
                    Err(e) => return (Err(e), None),
                };
                if let (None, true, Some(w)) = (cur, revisions, write.as_mut()) {
                    // A create: its fence comes from the revision the create gets.
                    w.store.insert(FENCE_FROM.0.into(), FENCE_FROM.1.into());
                }
                if let (true, Some(w)) = (confirm, write.as_mut()) {
                    // Floored at the high-water mark once written, before it is handed out.
                    w.store.insert(UNCONFIRMED.0.into(), UNCONFIRMED.1.into());
                }
                (Ok(out), write)
            })
            .await?;
        Ok(match (out?, written) {
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
                let d = self.rules(key, cur).renew(record(cur), token, ttl_ms);
                (d.outcome, keep_unconfirmed(cur, d.write))
            })
            .await?;
        Ok(out)
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        let (out, _) = self
            .cas(key, false, None, |cur| {
                let d = self.rules(key, cur).release(record(cur), token);
                (d.outcome, keep_unconfirmed(cur, d.write))
            })
            .await?;
        Ok(out)
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        self.cas(key, false, None, |cur| {
            let rules = self.rules(key, cur);
            (
                (),
                keep_unconfirmed(cur, decide::withdraw_waiter(record(cur), token, &rules)),
            )
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
            .cas(key, false, None, |cur| self.force_freed(key, cur, None))
            .await?;
        Ok(out)
    }

    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        let (out, written) = self
            .cas(key, false, None, |cur| {
                self.force_freed(key, cur, Some(holder))
            })
            .await?;
        Ok(out.filter(|_| written.is_some()))
    }

    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        self.check_conditional_delete().await?;
        let mut report = CleanupReport::default();
        let now = self.now();
        let server_clock = self.inner.server_clock();
        // Judged first, deleted after the high-water mark is raised above their fences.
        let mut doomed = Vec::new();
        let listed: Vec<_> = (self.inner.list_dated("").await?.into_iter())
            .filter(|(_, s, _)| !is_high_water(s))
            .collect();
        progress.add_found(listed.len() as u64);
        for (_, stored, age) in listed {
            if let Stored::Record { record, version } = self.resolve(stored) {
                let key = Key::internal(&record.key)?;
                let removable = if server_clock {
                    // Judged on the server's clock, by the age the listing read (the delete is
                    // conditioned on that version). Without an age, nothing is judged removable.
                    age.and_then(|age| {
                        let seen = self.observe_aged(&key, &version, &record, Some(age));
                        let rules = Rules {
                            now,
                            expiry: Expiry::Observed(seen),
                            fence_floor: 0,
                        };
                        rules
                            .removable(&record, Some(age), older_than)
                            .then_some(version)
                    })
                } else {
                    // A one-shot look: only a record free, or expired beyond any assumed skew,
                    // goes.
                    let rules = Rules {
                        now,
                        expiry: Expiry::Observed(self.first_sight()),
                        fence_floor: 0,
                    };
                    rules
                        .removable(&record, None, older_than)
                        .then_some(version)
                };
                if let Some(version) = removable {
                    doomed.push((key, version, record.fence));
                    continue;
                }
            }
            report.kept += 1;
            progress.add_done(1);
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
            progress.add_done(1);
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
mod tests;
