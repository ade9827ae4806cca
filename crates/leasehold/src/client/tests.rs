use super::acquire::RETRY_AFTER_ERROR;
use super::Locks;
use crate::error::{Error, Result};
use crate::holder::HolderId;
use crate::key::Key;
use crate::options::Backoff;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, ReleaseOutcome, RenewOutcome,
};
use crate::stores::memory::MemoryStore;
use async_trait::async_trait;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A memory store whose change notification cannot be made (a pub/sub connection refused)
/// unless `notifies`, counting acquisitions and subscriptions; its next `fail_acquires`
/// acquisitions fail with a retryable error.
#[derive(Debug, Default)]
struct NoNotifications {
    inner: MemoryStore,
    acquires: AtomicUsize,
    subscribes: AtomicUsize,
    notifies: bool,
    fail_acquires: AtomicUsize,
    /// When set, each release waits for a permit first (a store slow to answer releases).
    release_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// When set, each acquisition's answer waits for a permit after the store has applied it
    /// (an answer in flight).
    answer_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Its next `lose_answers` acquisitions are applied, and answered with a retryable error (an
    /// answer lost on the way).
    lose_answers: AtomicUsize,
}

/// Counts `n` down by one; whether it was above zero.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

#[async_trait]
impl LockStore for NoNotifications {
    fn describe(&self) -> String {
        "memory without notifications".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.fail_acquires) {
            return Err(Error::unavailable(self.describe(), "no answer"));
        }
        let answer = self.inner.acquire(req).await;
        if take_one(&self.lose_answers) {
            return Err(Error::unavailable(self.describe(), "the answer was lost"));
        }
        if let Some(gate) = &self.answer_gate {
            if let Ok(permit) = gate.acquire().await {
                permit.forget(); // one answer per permit
            }
        }
        answer
    }
    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        self.inner.renew(key, token, ttl).await
    }
    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        if let Some(gate) = &self.release_gate {
            if let Ok(permit) = gate.acquire().await {
                permit.forget(); // one release per permit
            }
        }
        self.inner.release(key, token).await
    }
    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        self.inner.withdraw_waiter(key, token).await
    }
    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        self.inner.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        self.inner.list(prefix).await
    }
    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        self.inner.force_release(key).await
    }
    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        self.inner.cleanup(older_than, progress).await
    }
    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        self.subscribes.fetch_add(1, Ordering::SeqCst);
        if self.notifies {
            return self.inner.subscribe(key).await;
        }
        Err(Error::Unavailable {
            source: None,
            store: self.describe(),
            detail: "no pub/sub connection".into(),
        })
    }
}

/// A waiter with long timers, woken by the release's notification, whose attempt then fails
/// (the store in a failover, say): it attempts again within a second, not after its backoff,
/// and gets the lease.
#[tokio::test(start_paused = true)]
async fn a_waiter_whose_woken_attempt_fails_attempts_again_within_a_second() {
    let store = Arc::new(NoNotifications {
        notifies: true,
        ..Default::default()
    });
    let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    let b = Locks::from_arc(store.clone()).with_holder(HolderId::new("b"));
    let held = a
        .lock("k")
        .unwrap()
        .ttl(Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    let long = Duration::from_secs(60);
    let waiter = tokio::spawn(async move {
        b.lock("k")
            .unwrap()
            .register_waiter(false)
            .backoff(Backoff {
                initial: long,
                max: long,
            })
            .wait(Duration::from_secs(300))
            .acquire()
            .await
    });
    // The waiter has attempted and subscribed.
    while store.subscribes.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    store.fail_acquires.store(1, Ordering::SeqCst);
    let released = tokio::time::Instant::now();
    held.release().await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() <= RETRY_AFTER_ERROR + Duration::from_millis(10),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(
        store.fail_acquires.load(Ordering::SeqCst),
        0,
        "no attempt failed"
    );
    got.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_without_notifications_polls_and_subscribes_again_once_a_second() {
    let store = Arc::new(NoNotifications::default());
    let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    let b = Locks::from_arc(store.clone()).with_holder(HolderId::new("b"));
    let held = a
        .lock("k")
        .unwrap()
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let before = store.acquires.load(Ordering::SeqCst);
    let waited = b
        .lock("k")
        .unwrap()
        .wait(Duration::from_secs(10))
        .acquire()
        .await;
    assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
    let subscribes = store.subscribes.load(Ordering::SeqCst);
    let acquires = store.acquires.load(Ordering::SeqCst) - before;
    // One subscription at first, then one a second: not one per poll.
    assert!(
        (9..=12).contains(&subscribes),
        "{subscribes} subscriptions in 10 s"
    );
    // Polls by the backoff (at most 500 ms, jittered down to 250 ms) and nothing more: a
    // failed subscription is not followed by an attempt of its own.
    assert!(
        (20..=50).contains(&acquires),
        "{acquires} acquisitions in 10 s"
    );
    held.release().await.unwrap();
}

/// Whether the store shows `key` held by anyone.
async fn held_in_store(store: &dyn LockStore, key: &str) -> bool {
    let key = Key::new(key).unwrap();
    match store.inspect(&key).await.unwrap() {
        Some(Inspection::Record(r)) => r.is_held(crate::decide::Now::wall().ms),
        _ => false,
    }
}

/// Two tasks of holder `a` queued on `key` (the first waiting in the store, the second behind it
/// in the local layer) while holder `b` holds it; `b` then releases, so the first task's grant
/// reserves a block of two fences and can hand the lease on to the second. `lock` builds both
/// tasks' locks except the second's TTL, `second_ttl`.
async fn queued_pair(
    store: Arc<dyn LockStore>,
    ttl: Duration,
    second_ttl: Duration,
    auto_renew: bool,
) -> (
    crate::guard::LeaseGuard,
    tokio::task::JoinHandle<Result<crate::guard::LeaseGuard>>,
) {
    let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    let b = Locks::from_arc(store).with_holder(HolderId::new("b"));
    let held = b.lock("k").unwrap().ttl(ttl).acquire().await.unwrap();
    let lock = move |l: &Locks, ttl| {
        l.lock("k")
            .unwrap()
            .ttl(ttl)
            .auto_renew(auto_renew)
            .wait(Duration::from_secs(60))
    };
    let a1 = a.clone();
    let first = tokio::spawn(async move { lock(&a1, ttl).acquire().await });
    // Paused time: the sleep ends once every task waits (the first in the store, the second in
    // the local layer behind it).
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = tokio::spawn(async move { lock(&a, second_ttl).acquire().await });
    tokio::time::sleep(Duration::from_millis(1)).await;
    held.release().await.unwrap();
    let first = first.await.unwrap().unwrap();
    (first, second)
}

/// An acquisition dropped while it releases a handed-on lease that did not fit (another TTL)
/// leaves nothing held: the release goes on in the background.
#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_while_it_releases_a_carried_lease_leaves_it_released() {
    // One release passes (holder b's); the next waits at the gate.
    let gate = Arc::new(tokio::sync::Semaphore::new(1));
    let store = Arc::new(NoNotifications {
        notifies: true,
        release_gate: Some(gate.clone()),
        ..Default::default()
    });
    let ttl = Duration::from_secs(600);
    let (first, second) = queued_pair(store.clone(), ttl, ttl * 2, true).await;
    // Handed on to the second task, which releases it in the store (the TTL does not fit), where
    // the release waits at the gate; the second task is dropped then.
    first.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!second.is_finished());
    second.abort();
    let _ = second.await;
    gate.add_permits(16);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while held_in_store(&*store, "k").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the carried lease stayed held for nobody"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lease that waited to be handed on for longer than a renewal period, and was force-released
/// meanwhile, is not handed on: the next task acquires the key afresh in the store.
#[tokio::test(start_paused = true)]
async fn a_lease_force_released_while_it_waited_to_be_handed_on_is_not_handed_on() {
    let store = Arc::new(MemoryStore::new());
    let ttl = Duration::from_secs(30);
    let (first, second) = queued_pair(store.clone(), ttl, ttl, false).await;
    // Longer than a renewal period (10 s) without a word from the store; an operator frees it.
    tokio::time::sleep(Duration::from_secs(15)).await;
    store.force_release(&Key::new("k").unwrap()).await.unwrap();
    first.release().await.unwrap();
    let second = second.await.unwrap().unwrap();
    assert!(
        held_in_store(&*store, "k").await,
        "the next task started under a lease the store had freed"
    );
    second.release().await.unwrap();
}

/// A wait limit too long for the clock to add is no limit, not a panic.
#[tokio::test]
async fn a_wait_limit_beyond_the_clock_is_no_limit() {
    let locks = Locks::new(MemoryStore::new());
    let g = locks
        .lock("k")
        .unwrap()
        .wait(Duration::MAX)
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// A waiter further back in line sleeps through the change notifications that serve those
/// ahead of it, but the places ahead of it can lapse unheard (their waiters vanished): it looks
/// again within the time those ahead would have needed, instead of sleeping through the release
/// that makes it first and leaving the lease idle until its timer (five seconds here).
#[tokio::test]
async fn a_waiter_whose_places_ahead_lapse_unheard_is_not_left_idle() {
    let store: Arc<dyn LockStore> = Arc::new(MemoryStore::new());
    let locks = Locks::from_arc(store.clone()).with_local_layer(false);
    let held = locks
        .lock("k")
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    // Two waiters take places for 200 ms, and vanish.
    let key = Key::new("k").unwrap();
    for gone in ["gone-1", "gone-2"] {
        let req = AcquireRequest::new(key.clone(), gone, Duration::from_secs(30))
            .waiter(Duration::from_millis(200));
        let out = store.acquire(&req).await.unwrap();
        assert!(matches!(out, AcquireOutcome::Held(_)), "{out:?}");
    }
    let waiter = tokio::spawn({
        let locks = Locks::from_arc(store.clone()).with_local_layer(false);
        async move {
            let g = locks
                .lock("k")
                .unwrap()
                .waiter_ttl(Duration::from_secs(30))
                .backoff(Backoff {
                    initial: Duration::from_millis(10),
                    max: Duration::from_secs(5),
                })
                .wait(Duration::from_secs(30))
                .acquire()
                .await;
            (g, tokio::time::Instant::now())
        }
    });
    // Third in line.
    loop {
        let Some(Inspection::Record(r)) = store.inspect(&key).await.unwrap() else {
            panic!("held")
        };
        if r.queue.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The places ahead lapse; then the lease is released.
    tokio::time::sleep(Duration::from_millis(400)).await;
    held.release().await.unwrap();
    let released = tokio::time::Instant::now();
    let (g, at) = waiter.await.unwrap();
    let g = g.unwrap();
    let idle = at - released;
    assert!(
        idle < Duration::from_secs(2),
        "the lease was idle {idle:?} before its only waiter looked"
    );
    g.release().await.unwrap();
}

/// The key's record in `store`, if it has one.
async fn record_of(store: &dyn LockStore, key: &str) -> Option<LeaseRecord> {
    match store.inspect(&Key::new(key).unwrap()).await.unwrap() {
        Some(Inspection::Record(r)) => Some(r),
        _ => None,
    }
}

/// Waits (a few seconds at most) for what was left to the background, then says whether `key` is
/// free in `store` with nobody waiting for it.
async fn free_after_settling(store: &dyn LockStore, key: &str) -> bool {
    crate::background::settle(Duration::from_secs(5)).await;
    match record_of(store, key).await {
        None => true,
        Some(r) => {
            !r.is_held(crate::decide::Now::wall().ms) && r.waiter.is_none() && r.queue.is_empty()
        }
    }
}

/// A guard dropped on a plain thread, outside any runtime (as a binding's garbage collector
/// drops it), releases its lease at once on the runtime it was granted under: the key does not
/// stay taken for its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_any_runtime_is_released() {
    let store = Arc::new(MemoryStore::new());
    let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    let guard = a
        .lock("k")
        .unwrap()
        .ttl(Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    assert!(
        free_after_settling(&*store, "k").await,
        "the dropped guard's lease stayed held: {:?}",
        record_of(&*store, "k").await
    );
}

/// A waiting acquisition dropped on a plain thread (a blocking call interrupted by Ctrl-C)
/// withdraws its place in line: the key is not kept for a waiter that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_dropped_outside_any_runtime_withdraws_its_place() {
    let store = Arc::new(MemoryStore::new());
    let a = Locks::from_arc(store.clone()).with_holder(HolderId::new("a"));
    let b = Locks::from_arc(store.clone()).with_holder(HolderId::new("b"));
    let long = Duration::from_secs(600);
    let held = a.lock("k").unwrap().ttl(long).acquire().await.unwrap();
    let mut waiting = Box::pin(b.lock("k").unwrap().waiter_ttl(long).wait(long).acquire());
    let registered = async {
        while record_of(&*store, "k")
            .await
            .and_then(|r| r.waiter)
            .as_deref()
            != Some("b")
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::select! {
        got = &mut waiting => panic!("the waiter got {got:?}"),
        () = registered => {}
    }
    std::thread::spawn(move || drop(waiting)).join().unwrap();
    crate::background::settle(Duration::from_secs(5)).await;
    let r = record_of(&*store, "k").await.unwrap();
    assert!(
        r.waiter.is_none() && r.queue.is_empty(),
        "the dropped waiter kept its place: {r:?}"
    );
    held.release().await.unwrap();
    assert!(free_after_settling(&*store, "k").await);
}

/// An acquisition dropped on a plain thread while the store's grant is on its way back leaves
/// nothing taken: the call finishes on the runtime it was started under, which releases the
/// lease granted to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_outside_any_runtime_with_its_grant_in_flight_leaves_nothing() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let store = Arc::new(NoNotifications {
        notifies: true,
        answer_gate: Some(gate.clone()),
        ..Default::default()
    });
    let b = Locks::from_arc(store.clone()).with_holder(HolderId::new("b"));
    let mut acquiring = Box::pin(
        b.lock("k")
            .unwrap()
            .ttl(Duration::from_secs(600))
            .wait(Duration::from_secs(600))
            .acquire(),
    );
    let granted = async {
        while !held_in_store(&*store, "k").await {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::select! {
        got = &mut acquiring => panic!("the answer passed the gate: {got:?}"),
        () = granted => {}
    }
    std::thread::spawn(move || drop(acquiring)).join().unwrap();
    gate.add_permits(16);
    assert!(
        free_after_settling(&*store, "k").await,
        "the grant in flight stayed held for nobody: {:?}",
        record_of(&*store, "k").await
    );
}

/// An acquisition whose every answer is lost (the store applied its grant) gives up at its wait
/// limit, and releases what it may have been granted on its way out: the key is not left held
/// for nobody until its TTL.
#[tokio::test]
async fn an_acquisition_that_gives_up_after_unanswered_attempts_releases_their_grant() {
    let store = Arc::new(NoNotifications {
        notifies: true,
        lose_answers: AtomicUsize::new(usize::MAX),
        ..Default::default()
    });
    let locks = Locks::from_arc(store.clone()).with_local_layer(false);
    let out = locks
        .lock("k")
        .unwrap()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    assert!(matches!(out, Err(Error::Timeout { .. })), "{out:?}");
    assert!(store.acquires.load(Ordering::SeqCst) >= 1);
    crate::background::settle(Duration::from_secs(5)).await;
    let left = record_of(&*store, "k").await;
    assert!(
        left.as_ref().is_none_or(|r| r.token.is_none()),
        "the grant of an unanswered attempt stayed held for nobody: {left:?}"
    );
}
