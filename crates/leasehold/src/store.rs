//! The store contract: LockStore, RecordStore and their request and outcome types.

use crate::error::Result;
use crate::floor::Floor;
use crate::key::Key;
use crate::record::LeaseRecord;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a store can do, filled in by each store.
///
/// ```
/// use leasehold::{file::FileStore, memory::MemoryStore, LockStore};
/// let memory = MemoryStore::new().capabilities();
/// assert!(memory.watch && !memory.native_ttl && !memory.liveness);
/// let dir = tempfile::tempdir().unwrap();
/// let file = FileStore::open(dir.path(), Default::default())?.capabilities();
/// assert!(file.watch && file.liveness, "inotify, and a kernel lock per holder");
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The store expires records by itself (server-side TTL) rather than by readers comparing times.
    pub native_ttl: bool,
    /// The store can wake waiters on change ([`LockStore::subscribe`] returns a watch).
    pub watch: bool,
    /// A dead holder process frees its lease at once, not only after the TTL (a kernel lock, a
    /// session): true for the file store.
    pub liveness: bool,
    /// Where fences come from, in a few words.
    pub fence_source: &'static str,
    /// Waiters stand in one line per key and are served in arrival order: a released lease is
    /// reserved for the first in line, and the next moves up when it is granted; a place its
    /// waiter stops renewing lapses. Without it, one waiter is registered and the others race
    /// for the lease when it comes free.
    pub waiter_line: bool,
    /// A release is the grant: the holder's release makes the first live waiter in line the
    /// holder in the same write, with the next fence, [`unclaimed`](LeaseRecord::unclaimed)
    /// until that waiter's next acquire attempt claims it (renewing it to its own TTL; until
    /// then it lasts only what was left of the waiter's place in line). A waiter that leaves
    /// instead ([`LockStore::withdraw_waiter`]) releases it to the next in line. Without it, a
    /// released lease is only reserved for the first in line, which takes it with its next
    /// attempt.
    pub release_grants: bool,
    /// The store holds semaphores and read-write locks ([`AcquireRequest::permit`]); without it,
    /// a permit request is refused with [`crate::Error::NotSupported`].
    pub permits: bool,
    /// Whose clock judges when a lease expires: which clocks may be off without letting two
    /// holders in at once.
    pub expiry_clock: ExpiryClock,
}

/// Whose clock judges when a lease expires ([`Capabilities::expiry_clock`]).
///
/// ```
/// use leasehold::{memory::MemoryStore, ExpiryClock, LockStore};
/// assert_eq!(MemoryStore::new().capabilities().expiry_clock, ExpiryClock::Host);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExpiryClock {
    /// This host's clock: every holder is on the store's machine (a file's boot-time clock, a
    /// process's memory).
    Host,
    /// The server's own clock, read inside the server (a native TTL, the statement's `now()`, a
    /// lease the server keeps alive): the clients' wall clocks judge no expiry.
    Server,
    /// The server's clock as its answers date the records (`Date`, `Last-Modified`), and how
    /// long a record is seen unchanged: no client's wall clock is read, however far off it is.
    ServerDates,
    /// The clients' wall clocks (a record's expiry as its writer wrote it), assumed at most the
    /// adapter's `max_clock_skew` apart.
    Clients,
}

/// One acquisition attempt, for calling a [`LockStore`] directly (the lock API builds it for
/// you). See [`LockStore`] for an example.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The key.
    pub key: Key,
    /// Who asks.
    pub holder: String,
    /// The owner token this acquisition will hold the lease under (unique per acquisition).
    pub token: String,
    /// The lease's time to live.
    pub ttl: Duration,
    /// When set and the lease is held, register as its waiter for this long (the holder's
    /// `handoff_requested()` fires and the lease is reserved for us once freed).
    pub waiter_ttl: Option<Duration>,
    /// Labels stored with the lease.
    pub labels: BTreeMap<String, String>,
    /// How many consecutive fences the grant reserves (at least 1; default 1). The granted
    /// record's `fence` is the last of them, so the block is `fence − fences + 1 ..= fence`, and
    /// every later acquisition of the key gets a fence above the whole block. The local layer
    /// reserves one fence per task queued on the key, and hands the lease from task to task
    /// without a store call, each with the next fence of the block.
    pub fences: u64,
    /// The caller waits for change notifications ([`LockStore::subscribe`]) if the lease is held.
    /// A store that notifies only watched keys (Redis publishes a release only when a subscribed
    /// contender marked the record) marks the held record.
    pub watching: bool,
    /// Set once the caller no longer waits for this attempt's answer (its wait limit passed, its
    /// future was dropped; [`crate::LockBuilder::acquire`] then releases whatever the attempt
    /// still grants). A store that retries within one call (a compare-and-set store after a lost
    /// race) stops before its next request and answers [`crate::Error::GivenUp`]; a request
    /// already sent is answered as usual. Shared by the clones of one request.
    pub given_up: GiveUp,
    /// `Some` to take a permit of a semaphore or a read-write lock on the key instead of the
    /// key's lock (see [`PermitRequest`]). The granted record shows the permit as its holder,
    /// with its own fence; `fences` is ignored (one fence per permit). A store without
    /// [`Capabilities::permits`] refuses it with [`crate::Error::NotSupported`].
    pub permit: Option<PermitRequest>,
}

/// What a permit request asks for ([`AcquireRequest::permit`]).
///
/// A key is a lock, a semaphore of some count, or a read-write lock, as its record says; a
/// request of another kind (another count) while the key has holders or waiters is refused with
/// [`crate::Error::InvalidOption`] `permits`. A key with neither takes the kind it is asked as.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, AcquireOutcome, AcquireRequest, Key, LockStore, PermitRequest};
/// use std::time::Duration;
/// let (store, key, ttl) = (MemoryStore::new(), Key::new("slots")?, Duration::from_secs(30));
/// let ask = |who: &str| {
///     let mut req = AcquireRequest::new(key.clone(), who, ttl);
///     req.permit = Some(PermitRequest::Semaphore { permits: 2 });
///     req
/// };
/// let AcquireOutcome::Granted(a) = store.acquire(&ask("a")).await? else { panic!("free") };
/// let AcquireOutcome::Granted(b) = store.acquire(&ask("b")).await? else { panic!("one left") };
/// assert!(b.fence > a.fence, "a fence per permit");
/// assert!(matches!(store.acquire(&ask("c")).await?, AcquireOutcome::Held(_)), "both taken");
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitRequest {
    /// One permit of a semaphore of `permits` (1 ..= [`crate::PERMIT_LIMIT`]).
    Semaphore {
        /// The semaphore's permit count: every caller of the key names the same.
        permits: u32,
    },
    /// A read permit of a read-write lock: shared with other readers, not with a writer, and
    /// not granted while a writer waits ahead of it.
    Read,
    /// The write permit of a read-write lock: alone.
    Write,
}

impl PermitRequest {
    /// The kind of key the request takes a permit of.
    ///
    /// ```
    /// use leasehold::{PermitKind, PermitRequest};
    /// assert_eq!(PermitRequest::Read.kind(), PermitRequest::Write.kind());
    /// assert_eq!(PermitRequest::Semaphore { permits: 3 }.kind(), PermitKind::Semaphore { permits: 3 });
    /// ```
    pub fn kind(&self) -> crate::record::PermitKind {
        match *self {
            PermitRequest::Semaphore { permits } => {
                crate::record::PermitKind::Semaphore { permits }
            }
            PermitRequest::Read | PermitRequest::Write => crate::record::PermitKind::ReadWrite,
        }
    }

    /// Whether it asks for a read-write lock's write permit.
    pub fn write(&self) -> bool {
        matches!(self, PermitRequest::Write)
    }

    /// Refuses a permit count out of range.
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] `permits` for a semaphore of 0 or more than
    /// [`crate::PERMIT_LIMIT`] permits.
    pub fn validate(&self) -> crate::error::Result<()> {
        match *self {
            PermitRequest::Semaphore { permits }
                if !(1..=crate::record::PERMIT_LIMIT).contains(&permits) =>
            {
                Err(crate::error::Error::InvalidOption {
                    name: "permits",
                    reason: format!(
                        "a semaphore has 1 to {} permits, not {permits}",
                        crate::record::PERMIT_LIMIT
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// The error a store without [`Capabilities::permits`] answers a permit request with.
    pub fn not_supported(&self, store: &str) -> crate::error::Error {
        crate::error::Error::NotSupported {
            store: store.to_owned(),
            what: format!(
                "{} (this store holds locks only; see the store table of the permits page)",
                self.kind()
            ),
        }
    }
}

/// The flag of an acquisition its caller gave up ([`AcquireRequest::given_up`]); cloning shares it.
///
/// ```
/// use leasehold::GiveUp;
///
/// let flag = GiveUp::default();
/// let seen_by_the_store = flag.clone();
/// assert!(!seen_by_the_store.is_given_up());
/// flag.give_up();
/// assert!(seen_by_the_store.is_given_up());
/// ```
#[derive(Debug, Clone, Default)]
pub struct GiveUp(Arc<AtomicBool>);

impl GiveUp {
    /// Marks the acquisition given up (for every clone of the flag).
    pub fn give_up(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the acquisition was given up.
    pub fn is_given_up(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl AcquireRequest {
    /// A request with a fresh owner token (128 random bits, unique per request), no labels, no
    /// waiter registration and one fence.
    ///
    /// ```
    /// use leasehold::{AcquireRequest, Key};
    /// use std::time::Duration;
    /// let one = AcquireRequest::new(Key::new("k")?, "a", Duration::from_secs(30));
    /// let two = AcquireRequest::new(Key::new("k")?, "a", Duration::from_secs(30));
    /// assert_ne!(one.token, two.token, "same holder, two acquisitions");
    /// assert_eq!((one.fences, one.waiter_ttl, one.labels.len()), (1, None, 0));
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn new(key: Key, holder: impl Into<String>, ttl: Duration) -> Self {
        AcquireRequest {
            key,
            holder: holder.into(),
            token: crate::holder::new_token(),
            ttl,
            waiter_ttl: None,
            labels: BTreeMap::new(),
            fences: 1,
            watching: false,
            given_up: GiveUp::default(),
            permit: None,
        }
    }

    /// How many bytes the holder id and the labels take written as JSON (escapes included): what
    /// a store bounds, so that it never writes a record it cannot read back.
    ///
    /// ```
    /// use leasehold::{AcquireRequest, Key};
    /// use std::time::Duration;
    /// let mut req = AcquireRequest::new(Key::new("k")?, "a", Duration::from_secs(30));
    /// let bare = req.size();
    /// req.labels.insert("job".into(), "7".into());
    /// assert_eq!(req.size(), bare + r#"{"job":"7"}"#.len() - "{}".len());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn size(&self) -> usize {
        json_len(&self.holder).saturating_add(json_len(&self.labels))
    }

    /// Refuses a request whose holder id and labels ([`size`](Self::size)) take more than `limit`
    /// bytes: every store calls it at acquire with its own limit, so that what it writes can be
    /// read back whole (a record read back truncated could only be judged corrupt).
    ///
    /// # Errors
    /// [`crate::Error::InvalidOption`] `labels`, naming the size, the limit and the store.
    ///
    /// ```
    /// use leasehold::{AcquireRequest, Error, Key};
    /// use std::time::Duration;
    /// let mut req = AcquireRequest::new(Key::new("k")?, "a", Duration::from_secs(30));
    /// req.labels.insert("blob".into(), "x".repeat(100));
    /// assert!(req.check_size(1000, "file:///tmp/locks").is_ok());
    /// let err = req.check_size(64, "file:///tmp/locks").unwrap_err();
    /// assert!(matches!(err, Error::InvalidOption { name: "labels", .. }));
    /// assert!(err.to_string().contains("at most 64 bytes"), "{err}");
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// A permit ([`permit`](Self::permit)) shares its key's record with up to
    /// [`crate::PERMIT_LIMIT`] others, so it may carry a [`crate::PERMIT_LIMIT`]th of `limit`.
    pub fn check_size(&self, limit: usize, store: &str) -> Result<()> {
        let size = self.size();
        let (limit, per) = match self.permit {
            Some(_) => (limit / crate::record::PERMIT_LIMIT as usize, "permit"),
            None => (limit, "lease"),
        };
        if size <= limit {
            return Ok(());
        }
        Err(crate::error::Error::InvalidOption {
            name: "labels",
            reason: format!(
                "the holder id and labels of {} take {size} bytes written as JSON; {store} keeps \
                 at most {limit} bytes of them per {per} (keep large data elsewhere and label the \
                 {per} with a reference to it)",
                self.key
            ),
        })
    }

    /// Registers as waiter for `ttl` when the lease is held (if no other live waiter is
    /// registered): the holder learns it at its next renewal, and once the lease is freed it is
    /// reserved for this request's token until the registration lapses.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, AcquireOutcome, AcquireRequest, Key, LockStore};
    /// use std::time::Duration;
    /// let (store, key, ttl) = (MemoryStore::new(), Key::new("k")?, Duration::from_secs(30));
    /// let a = AcquireRequest::new(key.clone(), "a", ttl);
    /// let b = AcquireRequest::new(key.clone(), "b", ttl).waiter(Duration::from_secs(5));
    /// store.acquire(&a).await?;
    /// let AcquireOutcome::Held(r) = store.acquire(&b).await? else { panic!("a holds it") };
    /// assert_eq!(r.waiter.as_deref(), Some("b"));
    /// store.release(&key, &a.token).await?;
    /// let c = AcquireRequest::new(key.clone(), "c", ttl);
    /// assert!(matches!(store.acquire(&c).await?, AcquireOutcome::Held(_)), "reserved for b");
    /// assert!(matches!(store.acquire(&b).await?, AcquireOutcome::Granted(_)));
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn waiter(mut self, ttl: Duration) -> Self {
        self.waiter_ttl = Some(ttl);
        self
    }
}

/// The answer to an acquisition attempt. See [`LockStore`] for an example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lease is ours; the record as written (with the new fence).
    Granted(LeaseRecord),
    /// Someone else holds the lease (or it is reserved for another waiter); the record seen.
    Held(LeaseRecord),
}

/// The answer to a renewal.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, AcquireRequest, Key, LockStore, LostReason, RenewOutcome};
/// use std::time::Duration;
/// let (store, key) = (MemoryStore::new(), Key::new("k")?);
/// let req = AcquireRequest::new(key.clone(), "a", Duration::from_secs(1));
/// store.acquire(&req).await?;
/// let RenewOutcome::Renewed(r) = store.renew(&key, &req.token, Duration::from_secs(60)).await? else {
///     panic!("still ours")
/// };
/// assert_eq!(r.ttl_ms, 60_000);
/// store.force_release(&key).await?; // an operator frees it
/// let lost = store.renew(&key, &req.token, Duration::from_secs(60)).await?;
/// assert_eq!(lost, RenewOutcome::Lost(LostReason::Released));
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewOutcome {
    /// Still ours; the record as written (its waiter fields drive the handoff signal).
    Renewed(LeaseRecord),
    /// No longer ours.
    Lost(LostReason),
}

/// Why a lease is no longer ours; `Display` says it in words.
///
/// ```
/// use leasehold::LostReason;
/// let taken = LostReason::TakenOver { holder: "b".into() };
/// assert_eq!(taken.to_string(), "taken over by b");
/// assert_eq!(LostReason::Expired.to_string(), "expired before renewal");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// It expired before it was renewed.
    Expired,
    /// Another acquisition holds it now (takeover after expiry, or an overwrite).
    TakenOver {
        /// The new holder.
        holder: String,
    },
    /// The record is gone or free: force-released by an operator, or deleted.
    Released,
    /// Renewal failed for longer than the lease could still be valid, or failed in a way retrying
    /// cannot heal (a non-retryable error, such as a permission the store withdrew): the lease
    /// is then given up at once, before its TTL, since no later renewal could succeed.
    Unreachable {
        /// The last error seen.
        detail: String,
    },
}

impl LostReason {
    /// Whether the lease is known to be gone — the store said it expired, was taken over or was
    /// freed — so another holder may hold it already: whatever acts under it must stop at once.
    /// `false` for [`Unreachable`](Self::Unreachable), where the lease may still be valid until
    /// the guard's [`valid_until`](crate::LeaseGuard::valid_until).
    ///
    /// ```
    /// use leasehold::LostReason;
    /// assert!(LostReason::Released.is_gone());
    /// assert!(!LostReason::Unreachable { detail: "timeout".into() }.is_gone());
    /// ```
    pub fn is_gone(&self) -> bool {
        !matches!(self, LostReason::Unreachable { .. })
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Expired => f.write_str("expired before renewal"),
            LostReason::TakenOver { holder } => write!(f, "taken over by {holder}"),
            LostReason::Released => {
                f.write_str("released by someone else (force-release or deletion)")
            }
            LostReason::Unreachable { detail } => {
                write!(f, "store unreachable until expiry: {detail}")
            }
        }
    }
}

/// The answer to a release.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, AcquireRequest, Key, LockStore, ReleaseOutcome};
/// let (store, key) = (MemoryStore::new(), Key::new("k")?);
/// let req = AcquireRequest::new(key.clone(), "a", std::time::Duration::from_secs(30));
/// store.acquire(&req).await?;
/// assert_eq!(store.release(&key, &req.token).await?, ReleaseOutcome::Released);
/// assert_eq!(store.release(&key, &req.token).await?, ReleaseOutcome::NotHeld); // idempotent
/// assert_eq!(store.release(&key, "not-the-token").await?, ReleaseOutcome::NotHeld);
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease was ours and is now free.
    Released,
    /// The lease was no longer ours (expired, taken over, force-released or already released).
    NotHeld,
}

/// A record as read for `inspect` and `list`: sound, or corrupt (reported, never fatal; see
/// [`RecordMemoryStore::put_raw`](crate::stores::memory::RecordMemoryStore::put_raw) for a corrupt one).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, Inspection, Locks};
/// let locks = Locks::new(MemoryStore::new());
/// let a = locks.lock("job:1")?.try_acquire().await?.expect("free");
/// let b = locks.lock("job:2")?.try_acquire().await?.expect("free");
/// let c = locks.lock("other")?.try_acquire().await?.expect("free");
/// let jobs = locks.store().list("job:").await?;
/// let keys: Vec<_> = jobs.iter().map(|i| match i {
///     Inspection::Record(r) => r.key.as_str(),
///     Inspection::Corrupt { name, .. } => name.as_str(),
/// }).collect();
/// assert_eq!(keys, ["job:1", "job:2"]);
/// # drop((a, b, c));
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspection {
    /// A record that parsed.
    Record(LeaseRecord),
    /// A record that does not parse; the next `acquire` of its key recovers it.
    Corrupt {
        /// The store's name for it (file name, object name).
        name: String,
        /// What is wrong.
        detail: String,
    },
}

/// What `cleanup` did.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, CleanupProgress, Locks};
/// use std::time::Duration;
/// let locks = Locks::new(MemoryStore::new());
/// locks.lock("done")?.acquire().await?.release().await?;
/// let held = locks.lock("busy")?.acquire().await?;
/// let report = locks.store().cleanup(Duration::ZERO, &CleanupProgress::new()).await?;
/// assert_eq!((report.removed, report.kept), (1, 1)); // the held record stays
/// # drop(held);
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanupReport {
    /// Records removed.
    pub removed: usize,
    /// Records kept because they are held, waited for, or younger than the limit.
    pub kept: usize,
}

/// How far a [`LockStore::cleanup`] has got, for a progress bar: two counters the store raises
/// as it works and anyone holding the value (or a clone: clones share the counters) reads at any
/// time, from any thread. No lock is taken on either side.
///
/// The store's side of the contract:
/// - `found` is the number of records the store has found to examine so far ([`Self::add_found`]);
///   `done` the number of those it has decided on, removed or kept ([`Self::add_done`]). Both
///   only grow, and a store raises `found` for a record before it raises `done` for it, so a
///   reader of [`Self::get`] always sees `done <= found`.
/// - When `cleanup` returns `Ok(report)`, `done == found`, and `found == report.removed +
///   report.kept` unless another process deleted records between the store's listing and its
///   look at them (those count as done, neither removed nor kept). After an error the counters
///   say how far it got.
/// - How fine the steps are depends on the store: stores that examine records one by one (the
///   file store and the compare-and-set stores) count each record as it is decided; a store
///   that removes records in one server-side statement (PostgreSQL) or in one pass (etcd, the
///   memory store) raises both counters once, at the end; one whose records expire on the
///   server by themselves (Redis, Redlock) removes nothing and leaves both at zero.
///
/// A fresh value (zero, zero) per call: the counters of a reused value go on from where they were.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{file::FileStore, CleanupProgress, Locks, LockStore};
/// use std::time::Duration;
/// let dir = tempfile::tempdir().unwrap();
/// let locks = Locks::new(FileStore::open(dir.path(), Default::default())?);
/// for name in ["a", "b", "c"] {
///     locks.lock(name)?.acquire().await?.release().await?;
/// }
/// let progress = CleanupProgress::new();
/// // A progress bar would poll `progress.get()` while this runs (a clone can go to another task).
/// let report = locks.store().cleanup(Duration::ZERO, &progress).await?;
/// assert_eq!(progress.get(), (3, 3)); // (done, found)
/// assert_eq!(report.removed + report.kept, 3);
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct CleanupProgress(Arc<ProgressCounters>);

#[derive(Debug, Default)]
struct ProgressCounters {
    found: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicU64,
}

impl CleanupProgress {
    /// Counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// For a store: `n` more records found to examine.
    pub fn add_found(&self, n: u64) {
        self.0.found.fetch_add(n, Ordering::Release);
    }

    /// For a store: `n` more of the records found decided on (removed or kept).
    pub fn add_done(&self, n: u64) {
        self.0.done.fetch_add(n, Ordering::Release);
    }

    /// For a store that learns its counts only at the end: `n` records found and decided on.
    pub fn add_finished(&self, n: u64) {
        self.add_found(n);
        self.add_done(n);
    }

    /// `(done, found)` so far, with `done <= found`.
    pub fn get(&self) -> (u64, u64) {
        // `done` first: every record counted there was counted in `found` before, so the later
        // read of `found` sees at least as many.
        let done = self.0.done.load(Ordering::Acquire);
        (done, self.0.found.load(Ordering::Acquire))
    }
}

/// A subscription to changes of one key, taken *before* an acquisition attempt so that no change
/// between the attempt and the wait is missed.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, AcquireRequest, ChangeWatch, Key, LockStore};
/// let (store, key) = (MemoryStore::new(), Key::new("k")?);
/// let req = AcquireRequest::new(key.clone(), "a", std::time::Duration::from_secs(30));
/// store.acquire(&req).await?;
/// let mut watch = store.subscribe(&key).await?.expect("the memory store notifies");
/// store.release(&key, &req.token).await?;
/// watch.changed().await; // completes: the release changed the record
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[async_trait]
pub trait ChangeWatch: Send + fmt::Debug {
    /// Completes when the key may have changed since the subscription or the previous call.
    /// Spurious wake-ups are allowed. Cancel safe.
    async fn changed(&mut self);

    /// Whether this subscription hears nothing more (its connection ended, or its server stopped
    /// answering): a waiter then subscribes again. `changed` completes once when it turns stale.
    /// Default: never (a subscription that cannot go deaf).
    fn stale(&self) -> bool {
        false
    }

    /// Makes this the watch of the waiting acquisition `token`: from now on, `changed` may skip
    /// the changes that cannot concern it (a release that granted the lease to another waiter,
    /// [`Capabilities::release_grants`]), and completes for the grant to `token`. True when the
    /// store does so: the waiter then looks at every change it is woken for. Default: false (it
    /// wakes at every change).
    fn for_waiter(&mut self, token: &str) -> bool {
        let _ = token;
        false
    }

    /// For a watch made for a waiter ([`for_waiter`](Self::for_waiter)) after an attempt sent at
    /// `since`: whether it can tell every change since then (it heard them). If it can, one that
    /// concerns the waiter makes the next `changed` complete at once, and the waiter need not
    /// look at the store again before it sleeps. Default: false (it looks again at once).
    fn heard_since(&mut self, since: std::time::Instant) -> bool {
        let _ = since;
        false
    }
}

/// The lock-level store contract. See the crate docs and ARCHITECTURE.md for what every
/// implementation guarantees; the conformance suite in `leasehold-testkit` checks it.
///
/// All methods are cancel safe in the sense that dropping the future leaves the store consistent:
/// a cancelled `acquire` may still have taken the lease, which then expires after its TTL.
///
/// Most code uses [`crate::Locks`]; calling a store directly looks like this:
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::MemoryStore, AcquireOutcome, AcquireRequest, Key, LockStore};
/// use std::time::Duration;
/// let (store, key) = (MemoryStore::new(), Key::new("k")?);
/// let a = AcquireRequest::new(key.clone(), "a", Duration::from_secs(30));
/// let AcquireOutcome::Granted(first) = store.acquire(&a).await? else { panic!("free") };
/// // Contention is an answer, not an error: who holds it.
/// let b = AcquireRequest::new(key.clone(), "b", Duration::from_secs(30));
/// let AcquireOutcome::Held(seen) = store.acquire(&b).await? else { panic!("held") };
/// assert_eq!(seen.holder.as_deref(), Some("a"));
/// store.release(&key, &a.token).await?;
/// let AcquireOutcome::Granted(second) = store.acquire(&b).await? else { panic!("free") };
/// assert!(second.fence > first.fence, "fences only grow");
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
///
/// The store contract: a lock-level trait ([`LockStore`]) that stores with server-side atomics
/// implement directly, and a record-level compare-and-set trait ([`RecordStore`]) that stores with
/// only conditional writes implement; [`crate::adapter::RecordLockStore`] turns the second into the
/// first, so the lock algorithm of that family is written (and tested) once.
#[async_trait]
pub trait LockStore: Send + Sync + fmt::Debug + 'static {
    /// A description for messages (the URL without credentials).
    fn describe(&self) -> String;

    /// What this store can do.
    fn capabilities(&self) -> Capabilities;

    /// Takes the lease if it is free, expired, or its holder is known dead; otherwise reports who
    /// holds it and, if asked, registers the caller as waiter. Contention is `Ok(Held)`.
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome>;

    /// Extends the lease held under `token` to `ttl` from now; refuses if it is no longer ours.
    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome>;

    /// Frees the lease held under `token`, keeping its fence. Idempotent.
    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome>;

    /// Removes the waiter registration made under `token`, if it is still there; on a store
    /// whose release is the grant ([`Capabilities::release_grants`]), also releases a lease a
    /// release granted to `token` that it has not claimed ([`LeaseRecord::unclaimed`]).
    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()>;

    /// The record of `key`, if there is one.
    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>>;

    /// All records whose key starts with `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>>;

    /// Frees the lease whoever holds it (an operator's action); returns the record as it was.
    /// The holder's next renewal is refused and its `lost()` fires.
    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>>;

    /// Frees what `holder` holds on `key` (an operator's action): the lease, or on a semaphore
    /// or read-write key its permits, `holder` being a holder id or the owner token of one
    /// acquisition. Returns the record as it was when something was freed, `None` when `holder`
    /// held nothing there. The holder's next renewal is refused and its `lost()` fires. Default:
    /// [`crate::Error::NotSupported`] (a store without [`Capabilities::permits`] may keep it).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{memory::MemoryStore, HolderId, Locks, LockStore, Key};
    /// let store = std::sync::Arc::new(MemoryStore::new());
    /// let who = |id: &str| Locks::from_arc(store.clone()).with_holder(HolderId::new(id));
    /// let a = who("a").semaphore("slots", 2)?.acquire().await?;
    /// let b = who("b").semaphore("slots", 2)?.acquire().await?;
    /// let key = Key::new("slots")?;
    /// assert!(store.force_release_holder(&key, "a").await?.is_some());
    /// assert!(store.force_release_holder(&key, "a").await?.is_none(), "a holds nothing now");
    /// assert!(b.is_current());
    /// # drop(a); Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        let _ = (key, holder);
        Err(crate::error::Error::NotSupported {
            store: self.describe(),
            what: "releasing one holder by its id".into(),
        })
    }

    /// Removes records that are free (or expired) and were last touched longer than `older_than`
    /// ago. Fences stay monotonic for every key (see each store's fence notes). The store reports
    /// how far it has got in `progress` (see [`CleanupProgress`] for what each store counts, and
    /// an example); a caller with no use for it passes `&CleanupProgress::new()`.
    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport>;

    /// Subscribes to changes of `key` for fast wake-up of waiters; `None` when the store has no
    /// notification (waiters then poll with backoff).
    async fn subscribe(&self, _key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        Ok(None)
    }

    /// Asks for the release of the lease on `key` whose fence is `fence` (`None`: whichever is
    /// held) to be notified to subscribers ([`LockStore::subscribe`]) even though no contender
    /// waits for it: for an observer, such as `leasehold watch`, that waits for changes without
    /// acquiring. `Ok(false)` when the key no longer holds that lease (it changed since it was
    /// read: read it again), else `Ok(true)`, also when there is nothing to do.
    ///
    /// A store that notifies every change does nothing (the default). Redis notifies only
    /// releases a subscribed contender asked for: this marks the record `"watched":true`, a
    /// write that changes nothing else (its TTL, times and fence stay). The mark lasts as long as
    /// that lease, so an observer asks again for each lease it sees. PostgreSQL does the same
    /// with the row's `watched` column.
    ///
    /// ```
    /// # async fn f(store: &dyn leasehold::LockStore, key: &leasehold::Key) -> leasehold::Result<()> {
    /// let mut changes = store.subscribe(key).await?;
    /// if let Some(leasehold::Inspection::Record(r)) = store.inspect(key).await? {
    ///     if !store.notify_release(key, Some(r.fence)).await? {
    ///         // Released or taken over since it was read: read it again.
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    async fn notify_release(&self, _key: &Key, _fence: Option<u64>) -> Result<bool> {
        Ok(true)
    }

    /// The cheapest correct raw operations this store is judged against ([`Floor`]), through
    /// its own connection or transport: for measuring (`leasehold bench --floor`), not locking.
    /// `None` (the default) when the store has none.
    fn floor(&self) -> Option<Arc<dyn Floor>> {
        None
    }
}

/// A record read from a [`RecordStore`], with the version that conditions the next write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// A record that parsed.
    Record {
        /// The record.
        record: LeaseRecord,
        /// The store's version (resourceVersion, generation, ETag, …).
        version: String,
    },
    /// An object that is there but does not parse.
    Corrupt {
        /// The store's version of the corrupt object.
        version: String,
        /// What is wrong.
        detail: String,
        /// A fence number recovered from the damaged bytes, if any.
        salvaged_fence: Option<u64>,
    },
}

/// The record-level compare-and-set contract for stores with only conditional writes. Every write
/// is conditional: on no record (`create`) or on the version read (`replace`, `delete`); a lost
/// race is `Ok(None)` / `Ok(false)`, not an error.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::{memory::RecordMemoryStore, Key, LeaseRecord, RecordStore, Stored};
/// let (store, key) = (RecordMemoryStore::new(), Key::new("k")?);
/// let rec = LeaseRecord::free("k", 1);
/// let v1 = store.create(&key, &rec).await?.expect("created");
/// assert_eq!(store.create(&key, &rec).await?, None, "exists already");
/// let v2 = store.replace(&key, &rec, &v1).await?.expect("version matched");
/// assert_eq!(store.replace(&key, &rec, &v1).await?, None, "stale version");
/// assert!(matches!(store.get(&key).await?, Some(Stored::Record { version, .. }) if version == v2));
/// assert!(!store.delete(&key, &v1).await? && store.delete(&key, &v2).await?);
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[async_trait]
pub trait RecordStore: Send + Sync + fmt::Debug + 'static {
    /// A description for messages.
    fn describe(&self) -> String;

    /// What this store can do (`native_ttl` is always false here: expiry is judged from records).
    fn capabilities(&self) -> Capabilities;

    /// Reads the record of `key`.
    async fn get(&self, key: &Key) -> Result<Option<Stored>>;

    /// Reads the record of `key` with its **server age**: how long, at least, the record had gone
    /// unwritten when the server answered, by the server's own clock (an object store's `Date`
    /// header less the object's `Last-Modified`, less their resolution). `None` where the store
    /// has no such clock to read. The adapter starts its observation of a record it sees for the
    /// first time that long ago (see [`crate::adapter`]), so that a newcomer judges a crashed
    /// holder's lease by the server's clock and never by its own wall clock. Default:
    /// [`get`](Self::get), without an age.
    async fn get_dated(&self, key: &Key) -> Result<Option<(Stored, Option<Duration>)>> {
        Ok(self.get(key).await?.map(|s| (s, None)))
    }

    /// Whether [`get_dated`](Self::get_dated) reads the server's clock. The adapter then takes no
    /// decision on any client's wall clock: no record's written expiry is compared with it
    /// (the skew shortcut is off), only observation on the monotonic clock started at the
    /// server age. Default: false.
    fn server_clock(&self) -> bool {
        false
    }

    /// Creates the record if there is none; `Ok(None)` if one exists already.
    async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>>;

    /// Replaces the record if its version is still `version`; `Ok(None)` on a version mismatch.
    async fn replace(
        &self,
        key: &Key,
        record: &LeaseRecord,
        version: &str,
    ) -> Result<Option<String>>;

    /// Deletes the record if its version is still `version`; `Ok(false)` on a mismatch.
    async fn delete(&self, key: &Key, version: &str) -> Result<bool>;

    /// All records whose key starts with `prefix`, with their store names.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>>;

    /// [`list`](Self::list), each record with its server age as [`get_dated`](Self::get_dated)
    /// reads it. Default: [`list`](Self::list), without ages.
    async fn list_dated(&self, prefix: &str) -> Result<Vec<(String, Stored, Option<Duration>)>> {
        Ok(self
            .list(prefix)
            .await?
            .into_iter()
            .map(|(n, s)| (n, s, None))
            .collect())
    }

    /// Change notification, if the store has one.
    async fn subscribe(&self, _key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        Ok(None)
    }

    /// Whether the store's versions are **revisions**: numbers that every later write of any
    /// record of the store exceeds, a deletion included (an etcd revision, which is what a
    /// Kubernetes API server answers as `resourceVersion`; a store-wide write counter). The
    /// generic adapter then takes fences from revisions instead of a clock, so that neither a
    /// deleted record nor a lagging clock can make a fence go backwards (see
    /// [`crate::adapter`]). Default: false (fences are floored at the wall clock).
    fn revisions(&self) -> bool {
        false
    }

    /// The revision a version stands for, when [`revisions`](Self::revisions) is true and the
    /// version is one. Default: `None`.
    fn revision(&self, _version: &str) -> Option<u64> {
        None
    }

    /// The most bytes of holder id and labels a lease may carry on this store
    /// ([`AcquireRequest::check_size`], which the adapter calls at acquire): what a record can
    /// hold with a waiter's id of the same bound and still be written and read back whole.
    /// Default: [`DEFAULT_LABEL_LIMIT`].
    fn label_limit(&self) -> usize {
        DEFAULT_LABEL_LIMIT
    }

    /// Whether a record this store reads as [`Stored::Corrupt`] holds nothing: true when the
    /// store's own protocol still says who holds a key whatever else is damaged (a Kubernetes
    /// Lease's spec, which every client reads; a Lease is corrupt only when its spec is free and
    /// leasehold's annotations are damaged). Default false: a record that cannot be read is held
    /// by "unknown (corrupt record)" until its bytes were seen unchanged for longer than any lease
    /// lasts (see [`crate::adapter`]).
    fn corrupt_holds_nothing(&self) -> bool {
        false
    }

    /// As [`LockStore::floor`]: the store's raw conditional operations, for measuring. The
    /// adapter's lock store answers this one. Default: `None`.
    fn floor(&self) -> Option<Arc<dyn Floor>> {
        None
    }
}

/// The default [`RecordStore::label_limit`]: 64 KiB of holder id and labels, written as JSON. A
/// Kubernetes Lease, whose annotations may take 256 KiB in all, holds two of them.
pub const DEFAULT_LABEL_LIMIT: usize = 64 << 10;

/// A shared record store is a record store: several adapters (several simulated machines) can
/// work on one.
///
/// ```
/// use leasehold::{adapter::RecordLockStore, memory::RecordMemoryStore};
/// use std::sync::Arc;
/// let shared = Arc::new(RecordMemoryStore::new());
/// let (a, b) = (RecordLockStore::new(shared.clone()), RecordLockStore::new(shared));
/// # let _ = (a, b);
/// ```
#[async_trait]
impl<R: RecordStore + ?Sized> RecordStore for Arc<R> {
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    async fn get(&self, key: &Key) -> Result<Option<Stored>> {
        (**self).get(key).await
    }
    async fn get_dated(&self, key: &Key) -> Result<Option<(Stored, Option<Duration>)>> {
        (**self).get_dated(key).await
    }
    fn server_clock(&self) -> bool {
        (**self).server_clock()
    }
    async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>> {
        (**self).create(key, record).await
    }
    async fn replace(
        &self,
        key: &Key,
        record: &LeaseRecord,
        version: &str,
    ) -> Result<Option<String>> {
        (**self).replace(key, record, version).await
    }
    async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
        (**self).delete(key, version).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
        (**self).list(prefix).await
    }
    async fn list_dated(&self, prefix: &str) -> Result<Vec<(String, Stored, Option<Duration>)>> {
        (**self).list_dated(prefix).await
    }
    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        (**self).subscribe(key).await
    }
    fn revisions(&self) -> bool {
        (**self).revisions()
    }
    fn revision(&self, version: &str) -> Option<u64> {
        (**self).revision(version)
    }
    fn label_limit(&self) -> usize {
        (**self).label_limit()
    }
    fn corrupt_holds_nothing(&self) -> bool {
        (**self).corrupt_holds_nothing()
    }
    fn floor(&self) -> Option<Arc<dyn Floor>> {
        (**self).floor()
    }
}

/// The length of `v` written as JSON (never fails for strings and string maps).
fn json_len<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX, |v| v.len())
}

/// A store's options as its URL gives them, the one way the [registry](crate::stores) opens every
/// store: the options from the URL, then the store they make. A store of records implements
/// [`RecordStoreOptions`] instead, and gets this through the [adapter](crate::adapter).
pub(crate) trait StoreOptions: Sized + Send + 'static {
    /// Whether an [`Error::InvalidOption`](crate::error::Error::InvalidOption) of
    /// [`StoreOptions::connect`] is the URL's fault, and reported as an
    /// [`Error::InvalidUrl`](crate::error::Error::InvalidUrl) naming it (the object stores, whose
    /// names, endpoints and credentials' settings come from the URL).
    const OPTION_IS_URL_ERROR: bool = false;

    /// The options `url` gives (its scheme is one of the store's), or an
    /// [`Error::InvalidUrl`](crate::error::Error::InvalidUrl) saying what is wrong with it.
    fn from_url(url: &str) -> Result<Self>;

    /// The store the options make, as a lock store.
    fn connect(self) -> impl Future<Output = Result<Arc<dyn LockStore>>> + Send;

    /// For the fuzzer: what can be checked of the options without a server. The checks the store
    /// makes before it connects (their error), then the durations the options hold; panics where
    /// the options break an invariant of their own.
    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        Ok(Vec::new())
    }
}

/// The options of a store of records ([`RecordStore`]): as [`StoreOptions`], with the store they
/// make wrapped once for all of them in the [adapter](crate::adapter) with the options'
/// `max_clock_skew`.
pub(crate) trait RecordStoreOptions: Sized + Send + 'static {
    /// The store of records the options make.
    type Store: RecordStore;

    /// As [`StoreOptions::OPTION_IS_URL_ERROR`].
    const OPTION_IS_URL_ERROR: bool = false;

    /// As [`StoreOptions::from_url`].
    fn from_url(url: &str) -> Result<Self>;

    /// The largest wall-clock difference between machines the adapter assumes
    /// (`?max_clock_skew=`).
    fn max_clock_skew(&self) -> Duration;

    /// The store of records the options make.
    fn connect(self) -> impl Future<Output = Result<Self::Store>> + Send;

    /// As [`StoreOptions::checked`] (the adapter adds `max_clock_skew`).
    #[cfg(feature = "fuzzing")]
    fn checked(&self) -> Result<Vec<Duration>> {
        Ok(Vec::new())
    }
}
