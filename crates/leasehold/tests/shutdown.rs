//! `Locks::release_all`, the graceful-shutdown step, with leases being handed between tasks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use leasehold::stores::memory::MemoryStore;
use leasehold::{HolderId, Key, LockStore, Locks, Released};
use std::sync::Arc;

/// A lease handed on by a task that then shuts the process down, before the next task took it,
/// is released all the same once that task holds it: nothing stays held in the store.
#[tokio::test]
async fn release_all_catches_a_lease_being_handed_on() {
    let store: Arc<dyn LockStore> = Arc::new(MemoryStore::new());
    let locks = Locks::from_arc(store.clone()).with_holder(HolderId::new("p"));
    let key = Key::new("k").unwrap();
    let first = locks.lock_key(key.clone()).acquire().await.unwrap();
    // A and B queue behind `first`; A goes to the store reserving a fence for B.
    let (b_holds, b_held) = tokio::sync::oneshot::channel();
    let (b_may_go, b_go) = tokio::sync::oneshot::channel::<()>();
    let a = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            let g = locks.lock_key(key).acquire().await.unwrap();
            // Current-thread runtime: B cannot run between these two calls, so the lease is in
            // transit to B when `release_all` starts.
            assert_eq!(g.release().await.unwrap(), Released::Released);
            locks.release_all().await.unwrap()
        }
    });
    let b = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            let g = locks.lock_key(key).acquire().await.unwrap();
            let _ = b_holds.send(g.fence());
            let _ = b_go.await;
            g
        }
    });
    while locks.queued(&key) < 2 {
        tokio::task::yield_now().await;
    }
    first.release().await.unwrap();
    let released = a.await.unwrap();
    assert_eq!(released, 1, "release_all did not release the lease B took");
    b_held.await.unwrap();
    let _ = b_may_go.send(());
    let gb = b.await.unwrap();
    assert!(!gb.is_current(), "B still thinks it holds the lease");
    assert_eq!(gb.release().await.unwrap(), Released::AlreadyReleased);
    let other = Locks::from_arc(store).with_holder(HolderId::new("other"));
    assert!(
        other.lock_key(key).try_acquire().await.unwrap().is_some(),
        "the lease is still held in the store"
    );
}

/// After `release_all` a released lease goes back to the store, not to the next local task.
#[tokio::test]
async fn no_local_handoff_after_release_all() {
    let locks = Locks::new(MemoryStore::new()).with_holder(HolderId::new("p"));
    assert_eq!(locks.release_all().await.unwrap(), 0);
    let key = Key::new("k").unwrap();
    let first = locks.lock_key(key.clone()).acquire().await.unwrap();
    // A and B queue; A goes to the store reserving a fence for B (A's fence + 1).
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let (locks, key) = (locks.clone(), key.clone());
            tokio::spawn(async move {
                let g = locks.lock_key(key).acquire().await.unwrap();
                let f = g.fence();
                g.release().await.unwrap();
                f
            })
        })
        .collect();
    while locks.queued(&key) < 2 {
        tokio::task::yield_now().await;
    }
    first.release().await.unwrap();
    let mut fences = vec![];
    for t in tasks {
        fences.push(t.await.unwrap());
    }
    assert!(
        fences[1] > fences[0] + 1,
        "B got fence {} right after A's {}: handed on, not from the store",
        fences[1],
        fences[0]
    );
}
