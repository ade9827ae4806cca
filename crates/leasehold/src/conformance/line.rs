//! The waiters' line, on stores that keep one ([`crate::Capabilities::waiter_line`]): arrival
//! order, and a waiter that died skipped once its place lapses. On other stores these contracts
//! check nothing.

use super::*;

/// Where `holder` stands in `k`'s line as the store shows it (0: the registered waiter).
async fn place_of(store: &Arc<dyn LockStore>, k: &Key, holder: &str) -> Option<usize> {
    match store.inspect(k).await.expect("inspect") {
        Some(Inspection::Record(r)) if r.waiter.as_deref() == Some(holder) => Some(0),
        Some(Inspection::Record(r)) => r
            .queue
            .iter()
            .position(|w| w.holder == holder)
            .map(|i| i + 1),
        _ => None,
    }
}

/// Awaits `holder` standing in `k`'s line (the store looked at every 5 ms, for at most 5 s).
async fn until_in_line(store: &Arc<dyn LockStore>, k: &Key, holder: &str) -> usize {
    let give_up = Instant::now() + 5000 * MS;
    loop {
        if let Some(p) = place_of(store, k, holder).await {
            return p;
        }
        assert!(
            Instant::now() < give_up,
            "{holder} is not in the line of {k} after 5 s: {:?}",
            store.inspect(k).await
        );
        tokio::time::sleep(5 * MS).await;
    }
}

/// A task in which `holder` waits for `k` (TTL 2 s, up to 10 s) through the lock API.
fn spawn_waiter(
    store: &Arc<dyn LockStore>,
    k: &Key,
    holder: &str,
) -> tokio::task::JoinHandle<crate::error::Result<crate::guard::LeaseGuard>> {
    let (locks, k) = (client(store, holder), k.clone());
    tokio::spawn(async move {
        locks
            .lock_key(k)
            .ttl(2000 * MS)
            .wait(10_000 * MS)
            .acquire()
            .await
    })
}

/// Waiters are granted the lease in the order they joined the line; a latecomer that tries
/// while they wait does not get it.
pub async fn waiters_served_in_arrival_order(store: Arc<dyn LockStore>) {
    if !store.capabilities().waiter_line {
        return;
    }
    let k = key("arrival");
    let holder = take(&store, "holder", &k, "free").await;
    let served = Arc::new(parking_lot::Mutex::new(Vec::new()));
    // The first waiter keeps the lease until the latecomer has tried once more: otherwise all
    // four could be served before that try, which then rightly finds the key free.
    let checked = Arc::new(tokio::sync::Notify::new());
    let mut waiters = Vec::new();
    for i in 0..4usize {
        let name = format!("waiter-{i}");
        let locks = client(&store, &name);
        let (k2, served, checked) = (k.clone(), served.clone(), checked.clone());
        waiters.push(tokio::spawn(async move {
            let g = locks
                .lock_key(k2)
                .ttl(2000 * MS)
                .wait(15_000 * MS)
                .acquire()
                .await
                .expect("a waiter in line gets the lease");
            served.lock().push(i);
            if i == 0 {
                checked.notified().await;
            }
            g.release().await.expect("release");
        }));
        assert_eq!(until_in_line(&store, &k, &name).await, i, "{name}'s place");
    }
    let latecomer = client(&store, "latecomer");
    let late = latecomer.lock_key(k.clone());
    let got = late.clone().try_acquire().await.expect("latecomer");
    assert!(got.is_none(), "a latecomer took a held lease");
    holder.release().await.expect("release");
    let got = late.try_acquire().await.expect("latecomer");
    assert!(
        got.is_none(),
        "a latecomer took the lease reserved for the first in line"
    );
    checked.notify_one();
    for w in waiters {
        w.await.expect("waiter");
    }
    assert_eq!(
        *served.lock(),
        [0, 1, 2, 3],
        "the order the waiters were served in"
    );
}

/// A waiter that stopped renewing its place (its process died) holds up the line only until its
/// place lapses: the next waiter then gets the released lease.
pub async fn dead_waiter_is_skipped(store: Arc<dyn LockStore>) {
    if !store.capabilities().waiter_line {
        return;
    }
    let k = key("dead-waiter");
    let holder = take(&store, "holder", &k, "free").await;
    // The dead waiter: one attempt that takes a place, never renewed.
    let mut dead = AcquireRequest::new(k.clone(), "dead", 2000 * MS);
    dead.waiter_ttl = Some(600 * MS);
    let out = store
        .acquire(&dead)
        .await
        .expect("the dead waiter's attempt");
    assert!(matches!(out, AcquireOutcome::Held(_)), "{out:?}");
    assert_eq!(until_in_line(&store, &k, "dead").await, 0);
    let waiter = spawn_waiter(&store, &k, "alive");
    assert_eq!(until_in_line(&store, &k, "alive").await, 1);
    holder.release().await.expect("release");
    let released = Instant::now();
    let g = waiter
        .await
        .expect("task")
        .expect("the live waiter gets the lease once the dead one's place lapses");
    assert!(
        released.elapsed() < 4000 * MS,
        "the live waiter waited {:?} after the release for a place of 600 ms to lapse",
        released.elapsed()
    );
    g.release().await.expect("release");
}

/// `holder`'s raw acquisition of `k` as a waiter with a place of `wttl` (one attempt, not
/// renewed): it must find the key held and stand in line. Its request, for later attempts.
async fn stand_in_line(
    store: &Arc<dyn LockStore>,
    k: &Key,
    holder: &str,
    wttl: Duration,
) -> AcquireRequest {
    let mut req = AcquireRequest::new(k.clone(), holder, 2000 * MS);
    req.waiter_ttl = Some(wttl);
    req.labels.insert("who".into(), holder.into());
    let out = store.acquire(&req).await.expect("a waiter's attempt");
    assert!(matches!(out, AcquireOutcome::Held(_)), "{holder}: {out:?}");
    until_in_line(store, k, holder).await;
    req
}

/// `k`'s record, which must exist.
async fn record_of(store: &Arc<dyn LockStore>, k: &Key) -> crate::record::LeaseRecord {
    match store.inspect(k).await.expect("inspect") {
        Some(Inspection::Record(r)) => r,
        other => panic!("{k}: expected a record, found {other:?}"),
    }
}

/// On a store whose release is the grant ([`crate::Capabilities::release_grants`]): the
/// holder's release makes the first in line the holder, unclaimed, with the next fence, and the
/// next waiter moves up; nobody else can take it; the waiter's next attempt claims it (its TTL,
/// its labels, a block of fences above every fence issued), and an attempt of it after that
/// (a claim whose answer was lost) is granted the same fence again.
pub async fn release_grants_the_first_in_line(store: Arc<dyn LockStore>) {
    if !store.capabilities().release_grants {
        return;
    }
    let k = key("release-grants");
    let (a, a_fence) = raw_acquire(&store, &k, "a", 5000 * MS).await;
    let mut b = stand_in_line(&store, &k, "b", 3000 * MS).await;
    let c = stand_in_line(&store, &k, "c", 3000 * MS).await;
    assert_eq!(
        store.release(&k, &a).await.expect("release"),
        ReleaseOutcome::Released
    );
    let r = record_of(&store, &k).await;
    assert_eq!(
        r.token.as_deref(),
        Some(b.token.as_str()),
        "granted to b: {r:?}"
    );
    assert_eq!(r.holder.as_deref(), Some("b"));
    assert!(r.unclaimed, "not claimed yet: {r:?}");
    assert!(
        r.fence > a_fence,
        "the grant's fence {} ≤ {a_fence}",
        r.fence
    );
    assert_eq!(r.waiter.as_deref(), Some("c"), "c moved up: {r:?}");
    let granted_fence = r.fence;
    let out = store.acquire(&c).await.expect("c's attempt");
    assert!(
        matches!(out, AcquireOutcome::Held(_)),
        "c took b's grant: {out:?}"
    );
    let latecomer = client(&store, "latecomer");
    let got = latecomer
        .lock_key(k.clone())
        .try_acquire()
        .await
        .expect("try");
    assert!(got.is_none(), "a latecomer took b's grant");
    b.fences = 3;
    b.ttl = 4000 * MS;
    let AcquireOutcome::Granted(claimed) = store.acquire(&b).await.expect("b's claim") else {
        panic!("b's next attempt does not claim its grant");
    };
    assert!(!claimed.unclaimed && claimed.holder.as_deref() == Some("b"));
    assert_eq!(claimed.ttl_ms, 4000, "the claim renews to b's TTL");
    assert_eq!(claimed.labels.get("who").map(String::as_str), Some("b"));
    assert!(
        claimed.fence - 2 > granted_fence,
        "b's block {}..={} is not above the grant's fence {granted_fence}",
        claimed.fence - 2,
        claimed.fence
    );
    let AcquireOutcome::Granted(again) = store.acquire(&b).await.expect("b again") else {
        panic!("b's attempt after its claim is not granted");
    };
    assert_eq!(
        again.fence, claimed.fence,
        "a repeated claim issues no new block"
    );
    assert_eq!(record_of(&store, &k).await.fence, claimed.fence);
    store.release(&k, &b.token).await.expect("release");
    store.withdraw_waiter(&k, &c.token).await.expect("withdraw");
}

/// On a store whose release is the grant: a waiter granted the lease that never claims it (it
/// died, or is paused) holds it only for what was left of its place; the next waiter then gets
/// it, fenced above the grant.
pub async fn an_unclaimed_grant_lasts_only_its_place(store: Arc<dyn LockStore>) {
    if !store.capabilities().release_grants {
        return;
    }
    let k = key("unclaimed-grant");
    let (a, _) = raw_acquire(&store, &k, "a", 5000 * MS).await;
    stand_in_line(&store, &k, "paused", 600 * MS).await;
    let waiter = spawn_waiter(&store, &k, "alive");
    until_in_line(&store, &k, "alive").await;
    store.release(&k, &a).await.expect("release");
    let released = Instant::now();
    let r = record_of(&store, &k).await;
    assert!(
        r.unclaimed && r.holder.as_deref() == Some("paused"),
        "the release did not grant the first in line: {r:?}"
    );
    let g = waiter
        .await
        .expect("task")
        .expect("the next waiter gets the lease once the unclaimed grant's place lapses");
    assert!(
        released.elapsed() < 4000 * MS,
        "the next waiter waited {:?} for an unclaimed grant of a 600 ms place",
        released.elapsed()
    );
    assert!(
        g.fence() > r.fence,
        "{} ≤ the unclaimed grant's {}",
        g.fence(),
        r.fence
    );
    g.release().await.expect("release");
}

/// On a store whose release is the grant: a waiter that leaves after it was granted the lease
/// but before it claimed it (cancelled while the grant was in flight) releases it to the next in
/// line with its withdrawal; a release racing a withdrawal ends the same way whichever comes
/// first: never with the lease left to the waiter that left.
pub async fn a_waiter_that_leaves_passes_its_grant_on(store: Arc<dyn LockStore>) {
    if !store.capabilities().release_grants {
        return;
    }
    let k = key("leaves");
    let (a, _) = raw_acquire(&store, &k, "a", 5000 * MS).await;
    let b = stand_in_line(&store, &k, "b", 3000 * MS).await;
    let c = stand_in_line(&store, &k, "c", 3000 * MS).await;
    store.release(&k, &a).await.expect("release");
    let granted = record_of(&store, &k).await;
    assert_eq!(
        granted.token.as_deref(),
        Some(b.token.as_str()),
        "{granted:?}"
    );
    store.withdraw_waiter(&k, &b.token).await.expect("withdraw");
    let r = record_of(&store, &k).await;
    assert_eq!(
        r.token.as_deref(),
        Some(c.token.as_str()),
        "passed on to c: {r:?}"
    );
    assert!(r.unclaimed && r.fence > granted.fence, "{r:?}");
    let out = store.acquire(&b).await.expect("b again");
    assert!(
        matches!(&out, AcquireOutcome::Held(h) if h.token.as_deref() == Some(c.token.as_str())),
        "b, gone, takes c's grant back: {out:?}"
    );
    store.withdraw_waiter(&k, &b.token).await.expect("withdraw");
    store.withdraw_waiter(&k, &c.token).await.expect("withdraw");
    if let Some(Inspection::Record(r)) = store.inspect(&k).await.expect("inspect") {
        assert!(r.token.is_none(), "nobody left, yet held: {r:?}");
    }
    // The race, both ways round.
    for round in 0..6 {
        let k = key(&format!("race-{round}"));
        let (a, _) = raw_acquire(&store, &k, "a", 5000 * MS).await;
        let b = stand_in_line(&store, &k, "b", 3000 * MS).await;
        let c = stand_in_line(&store, &k, "c", 3000 * MS).await;
        let (s1, s2) = (store.clone(), store.clone());
        let (k1, k2) = (k.clone(), k.clone());
        let bt = b.token.clone();
        let release = tokio::spawn(async move { s1.release(&k1, &a).await });
        let withdraw = tokio::spawn(async move { s2.withdraw_waiter(&k2, &bt).await });
        release.await.expect("task").expect("release");
        withdraw.await.expect("task").expect("withdraw");
        let r = record_of(&store, &k).await;
        assert_eq!(
            r.token.as_deref(),
            Some(c.token.as_str()),
            "round {round}: the lease went to {:?}, not c: {r:?}",
            r.holder
        );
        store.withdraw_waiter(&k, &c.token).await.expect("withdraw");
    }
}
