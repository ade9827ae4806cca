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

/// Waiters are granted the lease in the order they joined the line; a latecomer that tries
/// while they wait does not get it.
pub async fn waiters_served_in_arrival_order(store: Arc<dyn LockStore>) {
    if !store.capabilities().waiter_line {
        return;
    }
    let k = key("arrival");
    let holder = take(&store, "holder", &k, "free").await;
    let served = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4usize {
        let name = format!("waiter-{i}");
        let locks = client(&store, &name);
        let (k2, served) = (k.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let g = locks
                .lock_key(k2)
                .ttl(2000 * MS)
                .wait(15_000 * MS)
                .acquire()
                .await
                .expect("a waiter in line gets the lease");
            served.lock().push(i);
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
    let alive = client(&store, "alive");
    let k2 = k.clone();
    let waiter = tokio::spawn(async move {
        alive
            .lock_key(k2)
            .ttl(2000 * MS)
            .wait(10_000 * MS)
            .acquire()
            .await
    });
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
