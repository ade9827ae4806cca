use super::acquire::RETRY_AFTER_ERROR;
use super::Locks;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::options::Backoff;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupReport, Inspection,
    LockStore, ReleaseOutcome, RenewOutcome,
};
use crate::stores::memory::MemoryStore;
use crate::HolderId;
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
        let fail = self
            .fail_acquires
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            return Err(Error::Unavailable {
                source: None,
                store: self.describe(),
                detail: "no answer".into(),
            });
        }
        self.inner.acquire(req).await
    }
    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        self.inner.renew(key, token, ttl).await
    }
    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
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
    async fn cleanup(&self, older_than: Duration) -> Result<CleanupReport> {
        self.inner.cleanup(older_than).await
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
