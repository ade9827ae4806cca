//! The conformance suite: the contracts of ARCHITECTURE.md as executable checks.
//!
//! Every function panics with a message saying which contract broke. TTLs are short (≤ 2 s); where
//! a test must wait for time (expiry) it sleeps only for the TTL, never to let a condition settle.

use leasehold::{
    AcquireOutcome, AcquireRequest, Error, HolderId, Inspection, Key, LockStore, Locks, LostReason,
    ReleaseOutcome, Released, RenewOutcome,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MS: Duration = Duration::from_millis(1);

fn key(name: &str) -> Key {
    Key::new(crate::prefix(name)).expect("test keys are valid")
}

/// A client acting as its own holder, with the local layer off so it talks to the store like
/// another process would.
pub fn client(store: &Arc<dyn LockStore>, holder: &str) -> Locks {
    Locks::from_arc(store.clone())
        .with_holder(HolderId::new(holder))
        .with_local_layer(false)
}

/// `holder` takes `k` at once, or the test fails saying why the key should have been free.
async fn take(
    store: &Arc<dyn LockStore>,
    holder: &str,
    k: &Key,
    why: &str,
) -> leasehold::LeaseGuard {
    match client(store, holder)
        .lock_key(k.clone())
        .try_acquire()
        .await
    {
        Ok(Some(g)) => g,
        Ok(None) => {
            let found = store.inspect(k).await;
            panic!("{holder}: {k} should be {why}; the store has {found:?}")
        }
        Err(e) => panic!("{holder}: {e}"),
    }
}

async fn raw_acquire(
    store: &Arc<dyn LockStore>,
    k: &Key,
    holder: &str,
    ttl: Duration,
) -> (String, u64) {
    raw_acquire_block(store, k, holder, ttl, 1).await
}

/// [`raw_acquire`] reserving a block of `fences` fences; the fence returned is the block's last.
async fn raw_acquire_block(
    store: &Arc<dyn LockStore>,
    k: &Key,
    holder: &str,
    ttl: Duration,
    fences: u64,
) -> (String, u64) {
    let mut req = AcquireRequest::new(k.clone(), holder, ttl);
    req.fences = fences;
    match store.acquire(&req).await.expect("store acquire") {
        AcquireOutcome::Granted(r) => (req.token, r.fence),
        AcquireOutcome::Held(r) => panic!("expected {k} to be free, held by {:?}", r.holder),
    }
}

/// At most one live holder per key; a second acquirer gets `None`; after release it gets the lease.
pub async fn exclusion(store: Arc<dyn LockStore>) {
    let k = key("exclusion");
    let (a, b) = (client(&store, "a"), client(&store, "b"));
    let ga = a
        .lock_key(k.clone())
        .ttl(2000 * MS)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    assert!(ga.is_current());
    assert!(
        b.lock_key(k.clone())
            .try_acquire()
            .await
            .expect("b")
            .is_none(),
        "second holder while held"
    );
    assert_eq!(ga.release().await.expect("release"), Released::Released);
    let gb = b
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("b")
        .expect("free after release");
    assert!(gb.fence() > ga.fence());
    gb.release().await.expect("release");
}

/// The same holder id acquiring a held key again is refused, never granted twice.
pub async fn reentry_is_refused(store: Arc<dyn LockStore>) {
    let k = key("reentry");
    let a = client(&store, "same");
    let g = a
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    assert!(
        a.lock_key(k.clone())
            .try_acquire()
            .await
            .expect("again")
            .is_none(),
        "reentrant grant"
    );
    // Also through the local layer of one `Locks`.
    let with_local = Locks::from_arc(store.clone()).with_holder(HolderId::new("same"));
    assert!(with_local
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("again")
        .is_none());
    g.release().await.expect("release");
}

/// A holder that stops renewing (crashed or stopped) loses the lease after its TTL, never before.
pub async fn expiry_takeover(store: Arc<dyn LockStore>) {
    let k = key("expiry");
    let ttl = 600 * MS;
    let t0 = Instant::now();
    let (_token, fence) = raw_acquire(&store, &k, "stopped", ttl).await;
    let b = client(&store, "b");
    assert!(
        b.lock_key(k.clone())
            .try_acquire()
            .await
            .expect("b")
            .is_none(),
        "taken before expiry"
    );
    let g = b
        .lock_key(k.clone())
        .wait(3000 * MS)
        .acquire()
        .await
        .expect("taken after expiry");
    let waited = t0.elapsed();
    assert!(
        waited >= ttl - 20 * MS,
        "taken over after {waited:?}, before the {ttl:?} TTL"
    );
    assert!(waited < ttl + 1500 * MS, "takeover took {waited:?}");
    assert!(g.fence() > fence);
    g.release().await.expect("release");
}

/// Renewal keeps a lease alive well past its TTL; a lease renewed by nobody dies.
pub async fn renewal_keeps_alive(store: Arc<dyn LockStore>) {
    let k = key("renewal");
    let a = client(&store, "a");
    let g = a
        .lock_key(k.clone())
        .ttl(300 * MS)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    tokio::time::sleep(1000 * MS).await; // three TTLs
    assert!(g.is_current(), "renewed lease no longer current");
    assert!(client(&store, "b")
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("b")
        .is_none());
    g.release().await.expect("release");

    let k2 = key("unrenewed");
    let g2 = a
        .lock_key(k2.clone())
        .ttl(300 * MS)
        .auto_renew(false)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let reason = tokio::time::timeout(2000 * MS, g2.lost())
        .await
        .expect("lost fires for an unrenewed lease");
    assert_eq!(reason, LostReason::Expired);
    assert!(!g2.is_current());
    let taken = client(&store, "b")
        .lock_key(k2.clone())
        .wait(2000 * MS)
        .acquire()
        .await
        .expect("b takes it");
    taken.release().await.expect("release");
}

/// A force-release fires the holder's `lost()` at its next renewal, and release then says so.
pub async fn lost_on_force_release(store: Arc<dyn LockStore>) {
    let k = key("force");
    let a = client(&store, "a");
    let g = a
        .lock_key(k.clone())
        .ttl(900 * MS)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let old = store
        .force_release(&k)
        .await
        .expect("force")
        .expect("a record");
    assert_eq!(old.holder.as_deref(), Some("a"));
    let t = Instant::now();
    let reason = tokio::time::timeout(1500 * MS, g.lost())
        .await
        .expect("lost within a renewal period");
    assert!(
        t.elapsed() <= 900 * MS,
        "lost fired after {:?}",
        t.elapsed()
    );
    assert!(
        matches!(reason, LostReason::Released | LostReason::TakenOver { .. }),
        "{reason:?}"
    );
    assert!(!g.is_current());
    assert!(matches!(
        g.release().await.expect("release"),
        Released::Lost(_)
    ));
}

/// A lease taken over after expiry (the holder was stopped) fires `lost()` at the next renewal,
/// and before the new holder got it the old one was no longer current.
pub async fn lost_on_takeover(store: Arc<dyn LockStore>) {
    let k = key("takeover");
    let (token, fence) = raw_acquire(&store, &k, "old", 300 * MS).await;
    tokio::time::sleep(350 * MS).await;
    let g = take(&store, "new", &k, "expired").await;
    assert!(g.fence() > fence);
    match store.renew(&k, &token, 300 * MS).await.expect("renew") {
        RenewOutcome::Lost(LostReason::TakenOver { holder }) => assert_eq!(holder, "new"),
        other => panic!("old holder renewed a taken-over lease: {other:?}"),
    }
    assert_eq!(
        store.release(&k, &token).await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    assert!(
        g.is_current(),
        "the old holder's release must not free the new holder's lease"
    );
    g.release().await.expect("release");
}

/// Fences strictly increase across release, expiry, takeover, force-release and cleanup.
pub async fn fencing_is_monotonic(store: Arc<dyn LockStore>) {
    let k = key("fence");
    let a = client(&store, "a");
    let mut last = 0u64;
    let mut check = |f: u64, how: &str| {
        assert!(f > last, "fence {f} after {how} is not above {last}");
        last = f;
    };
    for _ in 0..5 {
        let g = a
            .lock_key(k.clone())
            .try_acquire()
            .await
            .expect("a")
            .expect("free");
        check(g.fence(), "release");
        g.release().await.expect("release");
    }
    let (_, f) = raw_acquire(&store, &k, "x", 200 * MS).await;
    check(f, "release");
    tokio::time::sleep(250 * MS).await;
    let g = a
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("a")
        .expect("expired");
    check(g.fence(), "expiry");
    store.force_release(&k).await.expect("force");
    let g2 = take(&store, "b", &k, "forced free").await;
    check(g2.fence(), "force-release");
    drop(g);
    g2.release().await.expect("release");
    let report = store.cleanup(Duration::ZERO).await.expect("cleanup");
    // Stores with server-side expiry delete free records by themselves.
    assert!(
        report.removed >= 1 || store.capabilities().native_ttl,
        "cleanup removed nothing: {report:?}"
    );
    assert!(
        store.inspect(&k).await.expect("inspect").is_none(),
        "record not removed"
    );
    let g3 = a
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    check(g3.fence(), "cleanup deleted the record");
    g3.release().await.expect("release");
}

/// A grant reserving a block of fences (`AcquireRequest::fences`) returns the block's last fence in
/// the record; the whole block lies above every earlier fence and below every later one.
pub async fn fence_blocks(store: Arc<dyn LockStore>) {
    let k = key("fence-block");
    let (t, before) = raw_acquire(&store, &k, "a", 2000 * MS).await;
    store.release(&k, &t).await.expect("release");
    let (t, last) = raw_acquire_block(&store, &k, "a", 2000 * MS, 5).await;
    assert!(
        last >= before + 5,
        "a block of 5 fences ending at {last} overlaps the earlier fence {before}"
    );
    store.release(&k, &t).await.expect("release");
    next_grant_is_above(&store, &k, last, "a block ending at").await;
}

/// The next store grant of `k` gets a fence above `last` (`what` says what `last` was).
async fn next_grant_is_above(store: &Arc<dyn LockStore>, k: &Key, last: u64, what: &str) {
    let (t, after) = raw_acquire(store, k, "next", 2000 * MS).await;
    assert!(
        after > last,
        "store fence {after} after {what} {last} is not above it"
    );
    store.release(k, &t).await.expect("release");
}

/// The local layer hands a lease from task to task of one process without a store call, each
/// with its own fence: tasks queued behind a holder get one store grant between them. While
/// another process contends for the key: never two holders at once, fences strictly increasing in
/// the order the holders entered, and the other process still gets its turns.
pub async fn local_handoff(store: Arc<dyn LockStore>) {
    let k = key("local-handoff");
    let counting = Arc::new(Counting {
        inner: store.clone(),
        acquires: AtomicU64::new(0),
    });
    let counted: Arc<dyn LockStore> = counting.clone();

    // Alone: a holder and three tasks queued behind it; the first goes to the store reserving
    // fences for the two behind it, who get them without a store call.
    let locks = Locks::from_arc(counted.clone()).with_holder(HolderId::new("alone"));
    let first = locks
        .lock_key(k.clone())
        .ttl(2000 * MS)
        .acquire()
        .await
        .expect("acquire");
    let queued: Vec<_> = (0..3)
        .map(|_| {
            let (locks, k) = (locks.clone(), k.clone());
            tokio::spawn(async move {
                let g = locks
                    .lock_key(k)
                    .ttl(2000 * MS)
                    .wait(20_000 * MS)
                    .acquire()
                    .await
                    .expect("acquire");
                let fence = g.fence();
                g.release().await.expect("release");
                fence
            })
        })
        .collect();
    while locks.queued(&k) < 3 {
        tokio::task::yield_now().await;
    }
    first.release().await.expect("release");
    let mut got = vec![];
    for t in queued {
        got.push(t.await.expect("task"));
    }
    got.sort_unstable();
    assert_eq!(
        counting.acquires.swap(0, Ordering::SeqCst),
        2,
        "4 leases queued on one key took more than 2 store grants (fences {got:?})"
    );
    assert!(
        got[1] == got[0] + 1 && got[2] == got[1] + 1,
        "handed-on fences {got:?} are not the consecutive fences of one block"
    );
    let inside = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(std::sync::Mutex::new(Vec::<(u64, usize)>::new()));
    let (per_task, tasks_per_process) = (15, 4);
    let mut tasks = vec![];
    for (p, store) in [counted, store.clone()].into_iter().enumerate() {
        let locks = Locks::from_arc(store).with_holder(HolderId::new(format!("process-{p}")));
        for _ in 0..tasks_per_process {
            let (locks, k, inside, fences) =
                (locks.clone(), k.clone(), inside.clone(), fences.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_task {
                    let g = locks
                        .lock_key(k.clone())
                        .ttl(2000 * MS)
                        .wait(20_000 * MS)
                        .acquire()
                        .await
                        .expect("acquire");
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "two holders inside at once"
                    );
                    fences.lock().expect("poisoned").push((g.fence(), p));
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    assert_eq!(g.release().await.expect("release"), Released::Released);
                    assert_eq!(
                        g.release().await.expect("release"),
                        Released::AlreadyReleased
                    );
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let fences = fences.lock().expect("poisoned").clone();
    assert_eq!(fences.len(), 2 * tasks_per_process * per_task);
    for w in fences.windows(2) {
        assert!(
            w[1].0 > w[0].0,
            "fence {} (process {}) after {} (process {}) is not above it",
            w[1].0,
            w[1].1,
            w[0].0,
            w[0].1
        );
    }
    let store_acquires = counting.acquires.load(Ordering::SeqCst);
    assert!(
        store_acquires <= (tasks_per_process * per_task) as u64,
        "process 0 made {store_acquires} store grants for {} locks",
        tasks_per_process * per_task
    );
    let last = fences.last().map_or(0, |f| f.0);
    next_grant_is_above(&store, &k, last, "the last handed-on fence").await;
}

/// A lease handed on to a task that gives up before taking it is released in the store, not left
/// to expire.
pub async fn abandoned_handoff_is_released(store: Arc<dyn LockStore>) {
    let k = key("abandoned-handoff");
    let locks = Locks::from_arc(store.clone()).with_holder(HolderId::new("p"));
    let g = locks
        .lock_key(k.clone())
        .ttl(30_000 * MS)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let waiter = {
        let (locks, k) = (locks.clone(), k.clone());
        tokio::spawn(async move {
            locks
                .lock_key(k)
                .ttl(30_000 * MS)
                .wait(30_000 * MS)
                .acquire()
                .await
        })
    };
    // Let the waiter queue in the local layer (it waits there, not in the store).
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    drop(g);
    waiter.abort();
    // On a multi-thread runtime the waiter may take the handed-on lease before the abort lands; its
    // guard is then the task's output, which the handle keeps until awaited. Dropping it releases
    // the lease as well (without this the test failed about once in a hundred runs).
    drop(waiter.await);
    let other = client(&store, "other")
        .lock_key(k.clone())
        .ttl(2000 * MS)
        .wait(5000 * MS)
        .acquire()
        .await
        .expect("the abandoned lease was not released (it would only expire after 30 s)");
    other.release().await.expect("release");
}

/// An `acquire` or `try_acquire` dropped at any point (before, during or after its store call,
/// free key or held) leaves nothing taken: the lease it may have been granted is released and its
/// waiter registration withdrawn, so another holder gets the key at once, not after a TTL.
pub async fn cancelled_acquires_leave_nothing_taken(store: Arc<dyn LockStore>) {
    let k = key("cancelled-acquires");
    for round in 0..32u32 {
        // Odd rounds wait behind a holder (registered as waiter), even ones find the key free.
        let held = if round % 2 == 1 {
            Some(take(&store, "h", &k, "free (the last round released it)").await)
        } else {
            None
        };
        let l = client(&store, &format!("c{round}"));
        let k2 = k.clone();
        let task = tokio::spawn(async move {
            let b = l.lock_key(k2).ttl(30_000 * MS);
            if round % 4 == 0 {
                b.try_acquire().await.ok().flatten()
            } else {
                b.wait(30_000 * MS).acquire().await.ok()
            }
        });
        // Abort at a different point each round.
        for _ in 0..round * 4 {
            tokio::task::yield_now().await;
        }
        task.abort();
        // A guard the task returned before the abort landed is its output: dropping it releases.
        drop(task.await);
        if let Some(h) = held {
            h.release().await.expect("release");
        }
        let other = client(&store, "other")
            .lock_key(k.clone())
            .ttl(2000 * MS)
            .wait(4000 * MS)
            .acquire()
            .await
            .unwrap_or_else(|e| {
                panic!("round {round}: a cancelled acquisition left the key taken: {e}")
            });
        other.release().await.expect("release");
        // The given-up call may still be going on in the background (a store whose acquire
        // retries lost races, as the Kubernetes one does, can be granted the key after `other`
        // released it, and then releases it): the next round starts once that is done.
        leasehold::settle(5000 * MS).await;
    }
}

/// An observer that asked for a lease's release to be notified ([`LockStore::notify_release`],
/// what `leasehold watch` does) hears it through its subscription, though no contender waited;
/// asking about a lease the key does not hold (another fence) changes nothing and, on a store that
/// can tell, answers `false`.
pub async fn release_is_notified_when_asked(store: Arc<dyn LockStore>) {
    let k = key("notify");
    let g = take(&store, "h", &k, "free").await;
    assert!(
        store
            .notify_release(&k, Some(g.fence()))
            .await
            .expect("notify_release"),
        "the key holds the lease with that fence"
    );
    // Asking about another lease leaves this one as it is.
    let _ = store
        .notify_release(&k, Some(g.fence() + 1))
        .await
        .expect("notify_release");
    assert!(g.is_current());
    // Subscribed after the grant and the mark, so that the release is the change heard.
    let Some(mut changes) = store.subscribe(&k).await.expect("subscribe") else {
        // No notifications on this store: an observer polls, nothing to ask.
        return g.release().await.map(drop).expect("release");
    };
    g.release().await.expect("release");
    tokio::time::timeout(5000 * MS, changes.changed())
        .await
        .expect("the release was not notified to the subscriber within 5 s");
}

/// Only the owner renews or releases.
pub async fn owner_only(store: Arc<dyn LockStore>) {
    let k = key("owner");
    let g = take(&store, "a", &k, "free").await;
    assert_eq!(
        store.release(&k, "not-the-token").await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    assert!(matches!(
        store
            .renew(&k, "not-the-token", 1000 * MS)
            .await
            .expect("renew"),
        RenewOutcome::Lost(_)
    ));
    assert!(
        client(&store, "b")
            .lock_key(k.clone())
            .try_acquire()
            .await
            .expect("b")
            .is_none(),
        "freed by a stranger"
    );
    let missing = key("never-held");
    assert_eq!(
        store.release(&missing, "x").await.expect("release"),
        ReleaseOutcome::NotHeld
    );
    g.release().await.expect("release");
}

/// Release is idempotent and says whether the lease was still ours.
pub async fn idempotent_release(store: Arc<dyn LockStore>) {
    let k = key("idem");
    let g = take(&store, "a", &k, "free").await;
    assert_eq!(g.release().await.expect("1st"), Released::Released);
    assert_eq!(g.release().await.expect("2nd"), Released::AlreadyReleased);
    let (token, _) = raw_acquire(&store, &k, "raw", 2000 * MS).await;
    assert_eq!(
        store.release(&k, &token).await.expect("1st"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        store.release(&k, &token).await.expect("2nd"),
        ReleaseOutcome::NotHeld
    );
}

/// A waiter makes the holder's `handoff_requested()` fire within one renewal period; once the
/// holder releases, the waiter gets the lease and a third party arriving later does not.
pub async fn waiter_handoff(store: Arc<dyn LockStore>) {
    let k = key("handoff");
    let a = client(&store, "holder");
    let ga = a
        .lock_key(k.clone())
        .ttl(1500 * MS)
        .renew_every(100 * MS)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let b = client(&store, "waiter");
    let kb = k.clone();
    let registered_at = Instant::now();
    let waiter = tokio::spawn(async move {
        b.lock_key(kb)
            .ttl(1500 * MS)
            .wait(5000 * MS)
            .acquire()
            .await
    });
    let who = tokio::time::timeout(2000 * MS, ga.handoff_requested())
        .await
        .expect("handoff_requested fires");
    assert_eq!(who, "waiter");
    assert!(
        registered_at.elapsed() < 1000 * MS,
        "handoff signal took {:?}",
        registered_at.elapsed()
    );
    assert_eq!(ga.release().await.expect("release"), Released::Released);
    // A third party arriving after the release must not jump the queue.
    let c = client(&store, "latecomer");
    let stolen = c.lock_key(k.clone()).try_acquire().await.expect("c");
    let gb = waiter
        .await
        .expect("task")
        .expect("the waiter gets the lease");
    assert!(
        stolen.is_none(),
        "a latecomer took the lease reserved for the waiter"
    );
    assert!(gb.fence() > ga.fence());
    assert!(!gb.is_handoff_requested());
    gb.release().await.expect("release");
}

/// A waiter that gives up withdraws; the holder's release then frees the lease for anyone, and
/// the timeout error names the holder.
pub async fn waiter_withdraws_on_timeout(store: Arc<dyn LockStore>) {
    let k = key("withdraw");
    let g = take(&store, "busy-holder", &k, "free").await;
    let t = Instant::now();
    let err = client(&store, "impatient")
        .lock_key(k.clone())
        .wait(300 * MS)
        .acquire()
        .await
        .expect_err("held");
    assert!(
        t.elapsed() >= 290 * MS && t.elapsed() < 1500 * MS,
        "waited {:?}",
        t.elapsed()
    );
    match &err {
        Error::Timeout { holder, .. } => assert_eq!(holder, "busy-holder"),
        other => panic!("expected a timeout, got {other}"),
    }
    assert!(err.to_string().contains("busy-holder"));
    g.release().await.expect("release");
    let other = client(&store, "other")
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("c");
    assert!(
        other.is_some(),
        "a withdrawn waiter still reserves the lease"
    );
}

/// Nothing is written that cannot be read back whole: labels far over any store's limit (2 MiB)
/// are refused with `InvalidOption` `labels`, or granted and read back byte for byte; labels
/// that JSON must escape (control characters, quotes, non-ASCII) round-trip.
pub async fn labels_are_read_back_whole(store: Arc<dyn LockStore>) {
    let locks = client(&store, "a");
    let p = crate::prefix("labels");
    let big = "x".repeat(2 << 20);
    let key = format!("{p}/big");
    match locks
        .lock(&key)
        .unwrap()
        .label("blob", big.clone())
        .try_acquire()
        .await
    {
        Err(Error::InvalidOption {
            name: "labels",
            reason,
        }) => {
            assert!(reason.contains("at most"), "{reason}");
            assert!(store
                .inspect(&Key::new(&key).unwrap())
                .await
                .unwrap()
                .is_none());
        }
        Ok(Some(g)) => {
            match store.inspect(g.key()).await.unwrap() {
                Some(Inspection::Record(r)) => {
                    assert!(r.labels.get("blob") == Some(&big), "read back cut")
                }
                other => panic!("2 MiB of label read back as {other:?}"),
            }
            g.release().await.unwrap();
        }
        other => panic!("2 MiB of label: {other:?}"),
    }
    let odd = "\u{1}\"\\\n\té\u{10FFFF}".repeat(500);
    let g = locks
        .lock(format!("{p}/odd"))
        .unwrap()
        .label("odd", odd.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    match store.inspect(g.key()).await.unwrap() {
        Some(Inspection::Record(r)) => assert_eq!(r.labels.get("odd"), Some(&odd)),
        other => panic!("escaped labels read back as {other:?}"),
    }
    g.release().await.unwrap();
}

/// Hostile keys are refused with a typed error or handled safely; never a panic.
pub async fn hostile_keys(store: Arc<dyn LockStore>) {
    for bad in ["", "a\0b", "a\nb"] {
        assert!(
            matches!(Key::new(bad), Err(Error::InvalidKey { .. })),
            "{bad:?} accepted"
        );
    }
    assert!(matches!(
        Key::new("x".repeat(10 * 1024)),
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        Key::from_bytes(b"\xff\xfe"),
        Err(Error::InvalidKey { .. })
    ));
    let locks = client(&store, "a");
    assert!(matches!(locks.lock(""), Err(Error::InvalidKey { .. })));
    let p = crate::prefix("hostile");
    let long = format!("{p}/{}", "y".repeat(900));
    let odd = [
        format!("{p}/../x"),
        format!("{p}/../../etc/passwd"),
        format!("{p}/.."),
        format!("{p}/ä ö/🔒"),
        format!("{p}/a\\b"),
        format!("{p}/--0123456789abcdef0123456789abcdef"),
        long,
    ];
    let mut fences = vec![];
    for s in &odd {
        let k = Key::new(s).expect("valid key");
        let g = locks
            .lock_key(k.clone())
            .try_acquire()
            .await
            .expect("acquire")
            .expect("free");
        fences.push(g.fence());
        match store.inspect(&k).await.expect("inspect") {
            Some(Inspection::Record(r)) => assert_eq!(&r.key, s),
            other => panic!("inspect {s:?}: {other:?}"),
        }
        g.release().await.expect("release");
    }
    // Distinct keys are distinct locks.
    let a = locks
        .lock(&odd[0])
        .expect("k")
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let b = locks
        .lock(&odd[1])
        .expect("k")
        .try_acquire()
        .await
        .expect("b");
    assert!(b.is_some(), "two keys share one lock");
    a.release().await.expect("release");
    if let Some(b) = b {
        b.release().await.expect("release");
    }
}

/// N workers racing on one key never overlap; every increment of a non-atomic counter lands.
pub async fn racing_workers(store: Arc<dyn LockStore>) {
    let k = key("race");
    let inside = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let workers = 12;
    let iterations = 25;
    let mut tasks = vec![];
    for w in 0..workers {
        let locks = client(&store, &format!("worker-{w}"));
        let (k, inside, counter) = (k.clone(), inside.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..iterations {
                let g = locks
                    .lock_key(k.clone())
                    .ttl(2000 * MS)
                    .wait(20_000 * MS)
                    .acquire()
                    .await
                    .expect("acquire");
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two workers inside at once"
                );
                let v = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        (workers * iterations) as u64
    );
}

/// Operators see holder, fence and expiry; list filters by prefix; cleanup keeps held records.
pub async fn inspect_list_cleanup(store: Arc<dyn LockStore>) {
    let p = crate::prefix("ls");
    let locks = client(&store, "lister");
    let held = locks
        .lock(format!("{p}/held"))
        .expect("k")
        .label("task", "42")
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let freed = locks
        .lock(format!("{p}/freed"))
        .expect("k")
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    freed.release().await.expect("release");
    let list = store.list(&p).await.expect("list");
    let keys: Vec<&str> = list
        .iter()
        .filter_map(|i| match i {
            Inspection::Record(r) => Some(r.key.as_str()),
            Inspection::Corrupt { .. } => None,
        })
        .collect();
    // Free records stay (keeping their fence) except on stores whose records expire server-side.
    let expected = if store.capabilities().native_ttl {
        1
    } else {
        2
    };
    assert_eq!(keys.len(), expected, "{list:?}");
    assert!(keys.contains(&format!("{p}/held").as_str()));
    assert!(store.list(&format!("{p}/h")).await.expect("list").len() == 1);
    let Some(Inspection::Record(r)) = store.inspect(held.key()).await.expect("inspect") else {
        panic!("no record")
    };
    assert_eq!(r.holder.as_deref(), Some("lister"));
    assert_eq!(r.fence, held.fence());
    assert!(r.expires_ms > leasehold::record::now_ms());
    assert_eq!(r.labels.get("task").map(String::as_str), Some("42"));
    store.cleanup(Duration::ZERO).await.expect("cleanup");
    assert!(
        store.inspect(held.key()).await.expect("inspect").is_some(),
        "cleanup removed a held lease"
    );
    assert!(held.is_current());
    held.release().await.expect("release");
}

/// `try_acquire` answers at once when held, however long the wait options say.
pub async fn try_acquire_never_waits(store: Arc<dyn LockStore>) {
    let k = key("nowait");
    let g = take(&store, "a", &k, "free").await;
    let t = Instant::now();
    let r = client(&store, "b")
        .lock_key(k.clone())
        .wait(5000 * MS)
        .try_acquire()
        .await
        .expect("b");
    assert!(r.is_none());
    assert!(
        t.elapsed() < 500 * MS,
        "try_acquire waited {:?}",
        t.elapsed()
    );
    g.release().await.expect("release");
}

/// Dropping a guard releases the lease in the background.
pub async fn drop_releases(store: Arc<dyn LockStore>) {
    let k = key("drop");
    let g = take(&store, "a", &k, "free").await;
    drop(g);
    let got = client(&store, "b")
        .lock_key(k.clone())
        .wait(1000 * MS)
        .acquire()
        .await
        .expect("freed by drop");
    got.release().await.expect("release");
}

/// Counts acquisition calls, to check that waiters do not spin.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn LockStore>,
    acquires: AtomicU64,
}

#[async_trait::async_trait]
impl LockStore for Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capabilities(&self) -> leasehold::Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> leasehold::Result<AcquireOutcome> {
        let outcome = self.inner.acquire(req).await?;
        if matches!(outcome, AcquireOutcome::Granted(_)) {
            self.acquires.fetch_add(1, Ordering::SeqCst);
        }
        Ok(outcome)
    }
    async fn renew(
        &self,
        key: &Key,
        token: &str,
        ttl: Duration,
    ) -> leasehold::Result<RenewOutcome> {
        self.inner.renew(key, token, ttl).await
    }
    async fn release(&self, key: &Key, token: &str) -> leasehold::Result<ReleaseOutcome> {
        self.inner.release(key, token).await
    }
    async fn withdraw_waiter(&self, key: &Key, token: &str) -> leasehold::Result<()> {
        self.inner.withdraw_waiter(key, token).await
    }
    async fn inspect(&self, key: &Key) -> leasehold::Result<Option<Inspection>> {
        self.inner.inspect(key).await
    }
    async fn notify_release(&self, key: &Key, fence: Option<u64>) -> leasehold::Result<bool> {
        self.inner.notify_release(key, fence).await
    }
    async fn list(&self, prefix: &str) -> leasehold::Result<Vec<Inspection>> {
        self.inner.list(prefix).await
    }
    async fn force_release(&self, key: &Key) -> leasehold::Result<Option<leasehold::LeaseRecord>> {
        self.inner.force_release(key).await
    }
    async fn cleanup(&self, older_than: Duration) -> leasehold::Result<leasehold::CleanupReport> {
        self.inner.cleanup(older_than).await
    }
    async fn subscribe(
        &self,
        key: &Key,
    ) -> leasehold::Result<Option<Box<dyn leasehold::ChangeWatch>>> {
        self.inner.subscribe(key).await
    }
}

/// Waiters wait on notifications or timers, never in a busy loop: two waiters over a held lease
/// make a handful of attempts per second, not thousands.
pub async fn waiters_do_not_spin(store: Arc<dyn LockStore>) {
    let k = key("spin");
    let holder = client(&store, "holder");
    let g = holder
        .lock_key(k.clone())
        .ttl(1500 * MS)
        .try_acquire()
        .await
        .expect("a")
        .expect("free");
    let counting = Arc::new(Counting {
        inner: store.clone(),
        acquires: AtomicU64::new(0),
    });
    let counted: Arc<dyn LockStore> = counting.clone();
    let mut waiters = vec![];
    for w in ["w1", "w2"] {
        let locks = client(&counted, w);
        let k = k.clone();
        waiters.push(tokio::spawn(async move {
            locks
                .lock_key(k)
                .ttl(1500 * MS)
                .wait(1200 * MS)
                .acquire()
                .await
        }));
    }
    for w in waiters {
        assert!(matches!(w.await.expect("task"), Err(Error::Timeout { .. })));
    }
    let n = counting.acquires.load(Ordering::SeqCst);
    assert!(n <= 40, "two waiters made {n} attempts in 1.2 s");
    g.release().await.expect("release");
}
