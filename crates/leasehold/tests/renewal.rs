//! The renewal scheduler: one per `Locks`, shared by its guards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use leasehold::stores::memory::MemoryStore;
use leasehold::{LockStore, Locks};
use std::sync::Arc;
use std::time::Duration;

const TTL: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_keep_renewing_after_their_locks_is_dropped() {
    let store: Arc<dyn LockStore> = Arc::new(MemoryStore::new());
    // The `Locks` is a temporary: only the guard keeps the scheduler alive.
    let g = Locks::from_arc(store.clone())
        .lock("k")
        .unwrap()
        .ttl(TTL)
        .acquire()
        .await
        .unwrap();
    // Waiting for time itself: four TTLs, renewed every TTL/3.
    tokio::time::sleep(TTL * 4).await;
    assert!(g.is_current(), "the lease was not renewed");
    let other = Locks::from_arc(store)
        .lock("k")
        .unwrap()
        .try_acquire()
        .await;
    assert!(other.unwrap().is_none(), "the lease expired");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_guards_with_different_ttls_all_stay_alive_and_released_ones_stop() {
    let store: Arc<dyn LockStore> = Arc::new(MemoryStore::new());
    let locks = Locks::from_arc(store.clone());
    let mut guards = vec![];
    // Longer TTLs first, so shorter ones must wake the scheduler earlier than it planned.
    for (i, ms) in [900u64, 600, 300, 450].iter().enumerate() {
        let g = locks
            .lock(format!("k{i}"))
            .unwrap()
            .ttl(Duration::from_millis(*ms))
            .acquire()
            .await
            .unwrap();
        guards.push(g);
    }
    let released = guards.pop().unwrap();
    released.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for g in &guards {
        assert!(g.is_current(), "{:?} was not renewed", g.key());
    }
    assert_eq!(locks.held(), 3);
    // The released key is free for anyone.
    let again = Locks::from_arc(store)
        .lock("k3")
        .unwrap()
        .try_acquire()
        .await;
    assert!(again.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_guards_renew_on_time() {
    let store: Arc<dyn LockStore> = Arc::new(MemoryStore::new());
    let locks = Locks::from_arc(store);
    let ttl = Duration::from_millis(1500);
    let mut guards = vec![];
    for i in 0..10_000 {
        guards.push(
            locks
                .lock(format!("k{i}"))
                .unwrap()
                .ttl(ttl)
                .try_acquire()
                .await
                .unwrap()
                .unwrap(),
        );
    }
    for round in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let current = guards.iter().filter(|g| g.is_current()).count();
        assert_eq!(current, 10_000, "round {round}: renewals late");
    }
}

/// A guard's futures can be spawned (they hold no lock across an await), and `lost()` and
/// `handoff_requested()` wake on the change they wait for, also when it happens while they wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_and_handoff_futures_are_send_and_wake() {
    let store: Arc<dyn LockStore> = Arc::new(MemoryStore::new());
    let g = Arc::new(
        Locks::from_arc(store.clone())
            .lock("k")
            .unwrap()
            .ttl(TTL)
            .acquire()
            .await
            .unwrap(),
    );
    // `tokio::spawn` takes only `Send + 'static` futures.
    let lost = tokio::spawn({
        let g = g.clone();
        async move { g.lost().await }
    });
    let asked = tokio::spawn({
        let g = g.clone();
        async move { g.handoff_requested().await }
    });
    // A waiter registers; the next renewal tells the holder.
    let operator = store.clone();
    let waiter = tokio::spawn(async move {
        Locks::from_arc(store)
            .with_holder(leasehold::HolderId::new("w"))
            .lock("k")
            .unwrap()
            .ttl(TTL)
            .wait(Duration::from_secs(5))
            .acquire()
            .await
    });
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(3), asked)
            .await
            .expect("handoff_requested fired")
            .unwrap(),
        "w"
    );
    // Taken from us: the force-release fires `lost()` at the next renewal.
    operator.force_release(g.key()).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), lost)
        .await
        .expect("lost fired")
        .unwrap();
    eprintln!("lost: {reason}");
    waiter.await.unwrap().unwrap().release().await.unwrap();
}
