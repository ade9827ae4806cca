//! Holding a lease: exclusion, expiry, renewal, losing it, ownership, release.

use super::*;

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
