//! Semaphores and read-write locks: at most N holders, a writer alone, a waiting writer not
//! overtaken, fences rising across permits, lapsed permits coming back, one kind per key. A
//! store without [`Capabilities::permits`](crate::Capabilities::permits) must refuse every
//! permit request with [`Error::NotSupported`], and these contracts check that instead.

use super::*;
use crate::guard::LeaseGuard;
use crate::record::LeaseRecord;
use crate::store::PermitRequest;
use parking_lot::Mutex;

/// Whether the store holds permits; if not, checks that it refuses them plainly.
async fn supported(store: &Arc<dyn LockStore>) -> bool {
    if store.capabilities().permits {
        return true;
    }
    let k = key("unsupported");
    for want in [
        PermitRequest::Semaphore { permits: 2 },
        PermitRequest::Read,
        PermitRequest::Write,
    ] {
        let mut req = AcquireRequest::new(k.clone(), "a", 1000 * MS);
        req.permit = Some(want);
        match store.acquire(&req).await {
            Err(Error::NotSupported { .. }) => {}
            other => panic!("a store without permits must refuse {want:?}: {other:?}"),
        }
    }
    false
}

/// A request of `holder` for `want` on `k` (a lock when `None`), with a 30 s TTL: for a store's
/// own permit tests beside this suite.
pub fn permit_request(k: &Key, holder: &str, want: Option<PermitRequest>) -> AcquireRequest {
    let mut req = AcquireRequest::new(k.clone(), holder, 30 * 1000 * MS);
    req.permit = want;
    req
}

/// The record `req` is granted with; panics when it is held by another instead.
pub async fn expect_granted(store: &Arc<dyn LockStore>, req: &AcquireRequest) -> LeaseRecord {
    match store.acquire(req).await.expect("acquire") {
        AcquireOutcome::Granted(r) => r,
        AcquireOutcome::Held(r) => panic!("{} should be granted: {r:?}", req.holder),
    }
}

/// The record `req` is answered "held" with; panics when it is granted instead.
pub async fn expect_held(store: &Arc<dyn LockStore>, req: &AcquireRequest) -> LeaseRecord {
    match store.acquire(req).await.expect("acquire") {
        AcquireOutcome::Held(r) => r,
        AcquireOutcome::Granted(r) => panic!("{} should wait: {r:?}", req.holder),
    }
}

/// `k`'s record as [`LockStore::inspect`] gives it; panics when there is none.
pub async fn inspect_record(store: &Arc<dyn LockStore>, k: &Key) -> LeaseRecord {
    match store.inspect(k).await.expect("inspect") {
        Some(Inspection::Record(r)) => r,
        other => panic!("{k}: {other:?}"),
    }
}

/// Who is inside a guarded section, checked by each holder as it enters: the shared counter of
/// the multi-holder contracts.
#[derive(Default)]
struct Inside {
    readers: u32,
    writers: u32,
    /// The highest fence of a holder that has left (released): every later grant is above it.
    left: u64,
}

impl Inside {
    fn enter(&mut self, write: bool, fence: u64, limit: u32, started_after: u64) {
        assert!(
            fence > started_after,
            "fence {fence} is not above {started_after}, the fence of a permit released before \
             this acquisition began"
        );
        if write {
            assert_eq!(
                (self.readers, self.writers),
                (0, 0),
                "a writer entered beside others"
            );
            self.writers += 1;
        } else {
            assert_eq!(self.writers, 0, "a reader entered beside a writer");
            self.readers += 1;
            assert!(
                self.readers <= limit,
                "{} holders inside, at most {limit} allowed",
                self.readers
            );
        }
    }

    fn leave(&mut self, write: bool, fence: u64) {
        if write {
            self.writers -= 1;
        } else {
            self.readers -= 1;
        }
        self.left = self.left.max(fence);
    }
}

/// `workers` tasks each take `rounds` permits (`want(worker, round)`) and hold each a moment,
/// every entry checked against the others: at most `limit` shared holders, writers alone, every
/// fence above the fences of the permits released before its acquisition began.
async fn race(
    store: &Arc<dyn LockStore>,
    k: &Key,
    workers: usize,
    rounds: usize,
    limit: u32,
    want: fn(usize, usize) -> PermitRequest,
) {
    let inside = Arc::new(Mutex::new(Inside::default()));
    let mut tasks = vec![];
    for w in 0..workers {
        let locks = client(store, &format!("worker-{w}"));
        let (k, inside) = (k.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let p = want(w, round);
                let started_after = inside.lock().left;
                let builder = match p {
                    PermitRequest::Semaphore { permits } => {
                        locks.semaphore(k.as_str(), permits).expect("key")
                    }
                    PermitRequest::Read => locks.read_write(k.as_str()).expect("key").read(),
                    PermitRequest::Write => locks.read_write(k.as_str()).expect("key").write(),
                };
                let g = builder
                    .ttl(2000 * MS)
                    .wait(30_000 * MS)
                    .acquire()
                    .await
                    .unwrap_or_else(|e| panic!("worker-{w} {p:?}: {e}"));
                inside
                    .lock()
                    .enter(p.write(), g.fence(), limit, started_after);
                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..5))).await;
                inside.lock().leave(p.write(), g.fence());
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
}

/// Seven racing holders of a semaphore of three permits: never more than three inside, and at
/// some point more than one (it is not a lock); fences rise.
pub async fn semaphore_bounds_holders(store: Arc<dyn LockStore>) {
    if !supported(&store).await {
        return;
    }
    let k = key("sem");
    // Three holders at once, and not a fourth.
    let mut held = vec![];
    for who in ["a", "b", "c"] {
        let sem = client(&store, who).semaphore(k.as_str(), 3).unwrap();
        let g = sem.try_acquire().await.unwrap();
        held.push(g.unwrap_or_else(|| panic!("{who}: a permit of three should be free")));
    }
    let d = client(&store, "d").semaphore(k.as_str(), 3).unwrap();
    assert!(
        d.try_acquire().await.unwrap().is_none(),
        "a fourth permit of three"
    );
    for g in held {
        g.release().await.expect("release");
    }
    race(&store, &k, 7, 8, 3, |_, _| PermitRequest::Semaphore {
        permits: 3,
    })
    .await;
}

/// Readers and writers racing on a read-write lock: a writer is always alone, readers share.
pub async fn read_write_excludes(store: Arc<dyn LockStore>) {
    if !supported(&store).await {
        return;
    }
    let k = key("rw");
    race(&store, &k, 6, 8, crate::record::PERMIT_LIMIT, |w, round| {
        if (w + round) % 3 == 0 {
            PermitRequest::Write
        } else {
            PermitRequest::Read
        }
    })
    .await;
}

/// A key is one kind while used: another permit count, a read-write request or a lock is
/// refused with `InvalidOption` `permits` while a permit is held; once free, the key takes the
/// kind asked, and its fences keep rising.
pub async fn one_kind_per_key(store: Arc<dyn LockStore>) {
    if !supported(&store).await {
        return;
    }
    let k = key("kind");
    let a = client(&store, "a");
    let held = a
        .semaphore(k.as_str(), 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    let refused = |r: crate::error::Result<Option<LeaseGuard>>| {
        assert!(
            matches!(
                r,
                Err(Error::InvalidOption {
                    name: "permits",
                    ..
                })
            ),
            "{r:?}"
        )
    };
    refused(a.semaphore(k.as_str(), 3).unwrap().try_acquire().await);
    refused(a.read_write(k.as_str()).unwrap().read().try_acquire().await);
    refused(a.lock_key(k.clone()).try_acquire().await);
    let fence = held.fence();
    held.release().await.expect("release");
    let lock = take(&store, "b", &k, "free: its last permit was released").await;
    assert!(
        lock.fence() > fence,
        "a lock after a semaphore is fenced above it"
    );
    lock.release().await.expect("release");
    let w = a
        .read_write(k.as_str())
        .unwrap()
        .write()
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(w.fence() > lock.fence());
}

/// A permit whose holder stops renewing comes back after its TTL; the holders' records show
/// every holder; the holders of a full semaphore hear that somebody waits.
pub async fn lapsed_permits_come_back(store: Arc<dyn LockStore>) {
    if !supported(&store).await {
        return;
    }
    let k = key("lapse");
    let want = PermitRequest::Semaphore { permits: 2 };
    // Two permits taken by a holder that will never renew them (a crashed process).
    let mut fences = vec![];
    for who in ["dead-1", "dead-2"] {
        let mut req = AcquireRequest::new(k.clone(), who, 300 * MS);
        req.permit = Some(want);
        match store.acquire(&req).await.expect("acquire") {
            AcquireOutcome::Granted(r) => fences.push(r.fence),
            AcquireOutcome::Held(r) => panic!("a permit should be free: {r:?}"),
        }
    }
    match store.inspect(&k).await.expect("inspect") {
        Some(Inspection::Record(r)) => {
            let t = r.permits.expect("a permit table");
            let who: Vec<_> = t.holders.iter().map(|p| p.holder.as_str()).collect();
            assert_eq!(who, ["dead-1", "dead-2"]);
        }
        other => panic!("inspect: {other:?}"),
    }
    let b = client(&store, "b");
    assert!(b
        .semaphore(k.as_str(), 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let started = Instant::now();
    let g = b
        .semaphore(k.as_str(), 2)
        .unwrap()
        .ttl(2000 * MS)
        .wait(10_000 * MS)
        .acquire()
        .await
        .expect("a lapsed permit comes back");
    assert!(
        started.elapsed() >= 200 * MS,
        "granted before the permits lapsed"
    );
    assert!(g.fence() > fences[1]);
    // A full semaphore: its holders hear a waiter.
    let c = client(&store, "c");
    let second = c
        .semaphore(k.as_str(), 2)
        .unwrap()
        .ttl(600 * MS)
        .acquire()
        .await
        .expect("one left");
    let d = client(&store, "d");
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        d.semaphore(k2.as_str(), 2)
            .unwrap()
            .ttl(2000 * MS)
            .wait(10_000 * MS)
            .acquire()
            .await
    });
    let heard = tokio::time::timeout(5000 * MS, second.handoff_requested()).await;
    assert_eq!(heard.expect("handoff_requested fires"), "d");
    second.release().await.expect("release");
    let granted = waiter
        .await
        .expect("task")
        .expect("the waiter gets the permit");
    assert!(granted.fence() > g.fence());
}

/// A writer that waits is not overtaken by readers that come after it, and a reader waits
/// behind it until it is done.
pub async fn waiting_writer_blocks_new_readers(store: Arc<dyn LockStore>) {
    if !supported(&store).await {
        return;
    }
    let k = key("writer-first");
    let rw = |who: &str| client(&store, who).read_write(k.as_str()).unwrap();
    let r1 = rw("r1")
        .read()
        .ttl(2000 * MS)
        .acquire()
        .await
        .expect("free");
    let writer = rw("w");
    let waiting = tokio::spawn(async move {
        writer
            .write()
            .ttl(2000 * MS)
            .wait(10_000 * MS)
            .acquire()
            .await
    });
    // Until the writer stands in line.
    let deadline = Instant::now() + 5000 * MS;
    loop {
        if let Some(Inspection::Record(r)) = store.inspect(&k).await.expect("inspect") {
            if r.permits.is_some_and(|t| !t.writers_waiting.is_empty()) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the writer never stood in line");
        tokio::time::sleep(10 * MS).await;
    }
    assert!(
        rw("r2").read().try_acquire().await.unwrap().is_none(),
        "a reader overtook a waiting writer"
    );
    r1.release().await.expect("release");
    let w = waiting.await.expect("task").expect("the writer gets it");
    assert!(
        rw("r2").read().try_acquire().await.unwrap().is_none(),
        "the writer holds it"
    );
    let fence = w.fence();
    w.release().await.expect("release");
    let r2 = rw("r2")
        .read()
        .try_acquire()
        .await
        .unwrap()
        .expect("free again");
    assert!(r2.fence() > fence);
}

/// An operator frees one holder's permit by its id: that holder's `lost()` fires, the others
/// keep theirs.
pub async fn one_holder_is_force_released(store: Arc<dyn LockStore>) {
    if !supported(&store).await {
        return;
    }
    let k = key("force-one");
    let a = client(&store, "a")
        .semaphore(k.as_str(), 2)
        .unwrap()
        .ttl(600 * MS)
        .acquire()
        .await
        .expect("free");
    let b = client(&store, "b")
        .semaphore(k.as_str(), 2)
        .unwrap()
        .ttl(600 * MS)
        .acquire()
        .await
        .expect("free");
    let was = store
        .force_release_holder(&k, "a")
        .await
        .expect("force release");
    assert!(was.is_some(), "a held a permit");
    assert!(store
        .force_release_holder(&k, "a")
        .await
        .expect("again")
        .is_none());
    let lost = tokio::time::timeout(2000 * MS, a.lost())
        .await
        .expect("a's lost() fires");
    assert!(lost.is_gone(), "{lost:?}");
    tokio::time::sleep(300 * MS).await;
    assert!(b.is_current(), "b keeps its permit");
}
