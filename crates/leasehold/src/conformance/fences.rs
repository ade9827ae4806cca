//! Fences: strictly increasing, in blocks.

use super::*;

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
    let report = store
        .cleanup(Duration::ZERO, &crate::store::CleanupProgress::new())
        .await
        .expect("cleanup");
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
pub(super) async fn next_grant_is_above(
    store: &Arc<dyn LockStore>,
    k: &Key,
    last: u64,
    what: &str,
) {
    let (t, after) = raw_acquire(store, k, "next", 2000 * MS).await;
    assert!(
        after > last,
        "store fence {after} after {what} {last} is not above it"
    );
    store.release(k, &t).await.expect("release");
}
