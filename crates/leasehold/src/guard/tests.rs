//! The stop-by signal, on tokio's paused clock: a memory store whose renewals can be made to hang
//! (the store unreachable from this process only).

use crate::client::Locks;
use crate::error::Result;
use crate::guard::StopReason;
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, CleanupProgress, CleanupReport, Inspection,
    LockStore, LostReason, ReleaseOutcome, RenewOutcome,
};
use crate::stores::memory::MemoryStore;
use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A memory store whose renewals never answer while `cut` is set.
#[derive(Debug, Default)]
struct Cut {
    inner: MemoryStore,
    cut: AtomicBool,
}

#[async_trait]
impl LockStore for Cut {
    fn describe(&self) -> String {
        "memory, cut off on demand".into()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.inner.acquire(req).await
    }
    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        if self.cut.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
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
    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        self.inner.cleanup(older_than, progress).await
    }
}

const TTL: Duration = Duration::from_secs(30);

/// When renewals stop succeeding, the holder is told to stop at `valid_until − loss grace` — a
/// loss grace before `lost()`, not at it.
#[tokio::test(start_paused = true)]
async fn renewals_that_fail_tell_the_holder_to_stop_a_loss_grace_before_the_lease_ends() {
    let store = Arc::new(Cut::default());
    let locks = Locks::from_arc(store.clone());
    let guard = locks.lock("k").unwrap().ttl(TTL).acquire().await.unwrap();
    // Healthy renewals keep it from firing.
    tokio::select! {
        why = guard.must_stop() => panic!("stop with healthy renewals: {why}"),
        () = tokio::time::sleep(TTL * 3) => {}
    }
    assert!(!guard.is_stop_due());
    store.cut.store(true, Ordering::SeqCst);
    let (valid_until, stop_by) = (guard.valid_until(), guard.stop_by());
    assert_eq!(valid_until - stop_by, Duration::from_millis(9_849));
    let why = guard.must_stop().await;
    let fired = Instant::now();
    assert_eq!(why, StopReason::RenewalsFailing { valid_until });
    assert!(!why.is_gone());
    assert_eq!(fired, stop_by, "at the stop-by deadline");
    assert!(
        guard.is_stop_due() && guard.is_current(),
        "still ours until valid_until"
    );
    let reason = guard.lost().await;
    assert_eq!(
        Instant::now(),
        valid_until,
        "lost() stays the last moment: {reason}"
    );
    assert!(guard.must_stop().await == StopReason::Lost(reason));
}

/// A lease the store says is gone stops its holder at once, not at the stop-by deadline.
#[tokio::test(start_paused = true)]
async fn a_lease_the_store_says_is_gone_stops_its_holder_at_once() {
    let store = Arc::new(Cut::default());
    let locks = Locks::from_arc(store.clone());
    let guard = locks.lock("k").unwrap().ttl(TTL).acquire().await.unwrap();
    store.force_release(guard.key()).await.unwrap();
    let start = Instant::now();
    let why = guard.must_stop().await;
    assert_eq!(why, StopReason::Lost(LostReason::Released));
    assert!(why.is_gone());
    // At the next renewal (every TTL/3), long before the stop-by deadline.
    assert!(
        Instant::now() - start <= TTL / 3,
        "{:?}",
        Instant::now() - start
    );
}

/// Each renewal moves `valid_until`, and watchers hear of it; a released guard ends the watch.
#[tokio::test(start_paused = true)]
async fn renewals_move_valid_until_and_watchers_hear_of_it() {
    let locks = Locks::new(MemoryStore::new());
    let guard = locks.lock("k").unwrap().ttl(TTL).acquire().await.unwrap();
    let first = guard.valid_until();
    let next = guard.valid_until_changed(first).await.unwrap();
    assert!(next >= first + TTL / 4, "{:?}", next - first);
    assert_eq!(guard.valid_until(), next);
    guard.release().await.unwrap();
    assert_eq!(guard.valid_until_changed(next).await, None);
    assert!(!guard.is_stop_due(), "nothing to stop after release");
}

/// The loss grace is validated against the TTL and renewal period, naming the largest that fits;
/// the default fits at every TTL.
#[tokio::test(start_paused = true)]
async fn a_loss_grace_that_leaves_no_renewal_is_refused_naming_the_largest_that_fits() {
    let locks = Locks::new(MemoryStore::new());
    let err = locks
        .lock("k")
        .unwrap()
        .ttl(Duration::from_secs(2))
        .loss_grace(Duration::from_secs(2))
        .try_acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("at most 1.31s"), "{err}");
    for ms in [10u64, 11, 100, 2_000, 10_000, 30_000, 86_400_000] {
        let mut o = crate::options::LockOptions {
            ttl: Duration::from_millis(ms),
            ..Default::default()
        };
        assert!(
            o.renew_period() + o.loss_grace_period() + o.drift() < o.ttl,
            "{ms}"
        );
        o.loss_grace = Some(o.max_loss_grace());
        assert!(o.validate().is_ok(), "{ms}: {:?}", o.validate());
    }
}
