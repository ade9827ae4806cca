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
    let locks = crate::client::Locks::new(RecordLockStore::new(raced));
    // Every race takes 10 ms: all of them would take 650 ms; the caller leaves after 30.
    let left = tokio::time::timeout(Duration::from_millis(30), async {
        locks.lock("k")?.try_acquire().await
    })
    .await;
    assert!(left.is_err(), "still retrying when dropped: {left:?}");
    assert_eq!(crate::background::settle(Duration::from_secs(5)).await, 0);
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
        assert_eq!(rec.place_of(&r.token), Some(place));
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
    assert_eq!(rec.place_of(&w2.token), None, "{rec:?}");
    assert_eq!(rec.place_of(&w3.token), Some(1));
    // Released: reserved for "first", then "last" is next, not "gone".
    holder.release(&key, &h.token).await.unwrap();
    assert!(matches!(
        gone.acquire(&w2).await.unwrap(),
        AcquireOutcome::Held(_)
    ));
    let AcquireOutcome::Granted(g) = first.acquire(&w1).await.unwrap() else {
        panic!("the first in line was not served")
    };
    assert_eq!(g.place_of(&w3.token), Some(0));
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
        let err = store
            .cleanup(Duration::ZERO, &crate::store::CleanupProgress::new())
            .await
            .unwrap_err();
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
    let progress = crate::store::CleanupProgress::new();
    let report = store.cleanup(Duration::ZERO, &progress).await.unwrap();
    assert_eq!((report.removed, report.kept), (1, 1), "{report:?}");
    assert_eq!(progress.get(), (2, 2), "each record counted, no probe");
    assert_eq!(keys(&store).await, ["held"], "no scratch record left");
    let progress = crate::store::CleanupProgress::new();
    store.cleanup(Duration::ZERO, &progress).await.unwrap();
    assert_eq!(
        progress.get(),
        (1, 1),
        "the fence high-water mark is no record"
    );
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
    let report = store
        .cleanup(Duration::ZERO, &crate::store::CleanupProgress::new())
        .await
        .unwrap();
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
            Arc::new(RecordLockStore::new(Gated::new(shared.clone())).with_wall_clock_offset(*o))
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
            let report = who
                .cleanup(Duration::ZERO, &crate::store::CleanupProgress::new())
                .await
                .unwrap();
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
    assert_eq!(
        ahead
            .cleanup(Duration::ZERO, &crate::store::CleanupProgress::new())
            .await
            .unwrap()
            .removed,
        1
    );
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
    assert_eq!(
        ahead
            .cleanup(Duration::ZERO, &crate::store::CleanupProgress::new())
            .await
            .unwrap()
            .removed,
        1
    );
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

/// A record store whose writes are applied but whose next `lose` answers never come back
/// (an error, as a timed-out call reports it).
#[derive(Debug)]
struct LosesAnswers {
    inner: Arc<RecordMemoryStore>,
    lose: AtomicUsize,
}

impl LosesAnswers {
    fn answer(&self, written: Result<Option<String>>) -> Result<Option<String>> {
        let lost = self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        match (lost, &written) {
            (true, Ok(Some(_))) => Err(Error::unavailable("loses answers", "no answer")),
            _ => written,
        }
    }
}

#[async_trait]
impl RecordStore for LosesAnswers {
    fn describe(&self) -> String {
        "loses answers".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn get(&self, key: &Key) -> Result<Option<Stored>> {
        self.inner.get(key).await
    }
    async fn create(&self, key: &Key, r: &LeaseRecord) -> Result<Option<String>> {
        let written = self.inner.create(key, r).await;
        self.answer(written)
    }
    async fn replace(&self, key: &Key, r: &LeaseRecord, v: &str) -> Result<Option<String>> {
        let written = self.inner.replace(key, r, v).await;
        self.answer(written)
    }
    async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
        self.inner.delete(key, version).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
        self.inner.list(prefix).await
    }
}

/// A grant whose write was applied but whose answer was lost, retried with the same token
/// (as the client retries): granted at once, not held by its own orphan, and renewed in the
/// retry's write, so that the record's expiry counts from the retry, as the new guard's
/// `valid_until` does. Kept as it was, the store would free the lease (or the permit) that much
/// earlier than its holder stops.
#[tokio::test]
async fn a_grant_whose_answer_was_lost_is_renewed_by_its_retry() {
    for permit in [
        None,
        Some(crate::store::PermitRequest::Semaphore { permits: 1 }),
    ] {
        let shared = Arc::new(RecordMemoryStore::new());
        let store = RecordLockStore::new(LosesAnswers {
            inner: shared.clone(),
            lose: AtomicUsize::new(0),
        });
        let key = Key::new("lost-answer").unwrap();
        let mut req = request(&key, "me", Duration::from_millis(2_000));
        req.permit = permit;
        // Settled first (a permit's key is written free before its first grant), so that the
        // one answer lost below is the grant's.
        if permit.is_some() {
            let mut other = request(&key, "other", Duration::from_millis(2_000));
            other.permit = permit;
            let AcquireOutcome::Granted(g) = store.acquire(&other).await.unwrap() else {
                panic!("a free key")
            };
            store.release(&key, &other.token).await.unwrap();
            assert!(g.fence > 0);
        }
        store.inner().lose.store(1, Ordering::SeqCst);
        let first = store.acquire(&req).await;
        assert!(first.is_err(), "{permit:?}: the answer was lost: {first:?}");
        let lost_at = crate::record::now_us() / 1000;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let retried_at = crate::record::now_us() / 1000;
        let out = store.acquire(&req).await.unwrap();
        let AcquireOutcome::Granted(g) = out else {
            panic!("{permit:?}: the retry was held by its own orphan: {out:?}")
        };
        assert!(
            g.expires_ms >= retried_at + 2_000,
            "{permit:?}: the retry's lease ends at {} (its first grant's at about {})",
            g.expires_ms,
            lost_at + 2_000
        );
        // As stored: one holder (or one permit), renewed.
        let Some(Inspection::Record(stored)) = store.inspect(&key).await.unwrap() else {
            panic!("{permit:?}: no record")
        };
        match &stored.permits {
            Some(t) => {
                assert_eq!(t.holders.len(), 1, "{stored:?}");
                assert!(t.holders[0].expires_ms >= retried_at + 2_000, "{stored:?}");
            }
            None => {
                assert_eq!(stored.token.as_deref(), Some(req.token.as_str()));
                assert!(stored.expires_ms >= retried_at + 2_000, "{stored:?}");
                assert!(stored.waiter_token.is_none(), "no waiter of its own lease");
            }
        }
    }
}

/// A lock grant marked unconfirmed whose granter died before its confirming write (never
/// handed out) does not keep a permit request from the key once its lease is over: the
/// permit's settling step frees and confirms it (it looped on it, answering nothing, before).
#[tokio::test(start_paused = true)]
async fn a_permit_request_settles_a_lock_grant_never_confirmed() {
    let (_, m) = clocked_machines(&[0, 0]);
    let (dead, permitter) = (m[0].clone(), m[1].clone());
    let key = Key::new("never-confirmed").unwrap();
    let ttl = Duration::from_secs(1);
    let (g, reached, _go) = gate();
    *dead.inner().mark_gate.lock() = Some(g);
    let stuck = tokio::spawn({
        let (dead, key) = (dead.clone(), key.clone());
        async move { dead.acquire(&request(&key, "dead", ttl)).await }
    });
    reached.await.unwrap();
    // The granter dies between its marked write and its confirming one.
    stuck.abort();
    let mut p = request(&key, "permit", ttl);
    p.permit = Some(crate::store::PermitRequest::Semaphore { permits: 2 });
    for _ in 0..100 {
        match permitter.acquire(&p).await {
            Ok(AcquireOutcome::Granted(g)) => {
                assert!(!unconfirmed(&g), "{g:?}");
                return;
            }
            // A lock while its (never confirmed) grant lives.
            Err(Error::InvalidOption { .. }) => {}
            other => panic!("the permit request answered {other:?}"),
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    panic!("the permit was never granted");
}
