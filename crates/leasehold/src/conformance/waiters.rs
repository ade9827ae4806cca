//! Waiters: handoff requests, withdrawal, racing workers, no spinning.

use super::*;

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

/// Counts acquisition calls, to check that waiters do not spin.
#[derive(Debug)]
pub(super) struct Counting {
    pub(super) inner: Arc<dyn LockStore>,
    pub(super) acquires: AtomicU64,
}

#[async_trait::async_trait]
impl LockStore for Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capabilities(&self) -> crate::store::Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> crate::error::Result<AcquireOutcome> {
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
    ) -> crate::error::Result<RenewOutcome> {
        self.inner.renew(key, token, ttl).await
    }
    async fn release(&self, key: &Key, token: &str) -> crate::error::Result<ReleaseOutcome> {
        self.inner.release(key, token).await
    }
    async fn withdraw_waiter(&self, key: &Key, token: &str) -> crate::error::Result<()> {
        self.inner.withdraw_waiter(key, token).await
    }
    async fn inspect(&self, key: &Key) -> crate::error::Result<Option<Inspection>> {
        self.inner.inspect(key).await
    }
    async fn notify_release(&self, key: &Key, fence: Option<u64>) -> crate::error::Result<bool> {
        self.inner.notify_release(key, fence).await
    }
    async fn list(&self, prefix: &str) -> crate::error::Result<Vec<Inspection>> {
        self.inner.list(prefix).await
    }
    async fn force_release(
        &self,
        key: &Key,
    ) -> crate::error::Result<Option<crate::record::LeaseRecord>> {
        self.inner.force_release(key).await
    }
    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &crate::store::CleanupProgress,
    ) -> crate::error::Result<crate::store::CleanupReport> {
        self.inner.cleanup(older_than, progress).await
    }
    async fn subscribe(
        &self,
        key: &Key,
    ) -> crate::error::Result<Option<Box<dyn crate::store::ChangeWatch>>> {
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
