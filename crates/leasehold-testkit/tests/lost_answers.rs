//! A grant whose answer was lost, on the stores that keep their rules on the server (Redis, in
//! its scripts; PostgreSQL, in its statements): the server applied the grant, the test kit's
//! proxy held its answer until the client's call ran out of time, and the client retried with
//! the same owner token. The retry is answered at once (a lock is not held by its own orphan),
//! and its write renews the lease: the store frees it no earlier than its holder stops. Checked
//! by cutting the holder off right after the grant, while another client takes the key as soon
//! as the server lets it: when it does, the holder must no longer count itself current.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{Inspection, LeaseGuard, LockBuilder, LockStore, Locks};
use leasehold_testkit::proxy::TcpProxy;
use leasehold_testkit::servers::{shared_postgres, RedisServer};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(3);
/// Each call's bound, in the proxied URL: the client gives up a call whose answer is held.
const CALL_TIMEOUT: &str = "500ms";

/// The key for `l`: a lock, or a semaphore of one.
fn lease(l: &Locks, key: &str, permit: bool) -> LockBuilder {
    let b = match permit {
        true => l.semaphore(key, 1),
        false => l.lock(key),
    };
    b.unwrap().ttl(TTL).wait(Duration::from_secs(30))
}

/// Whether `holder` holds `key` (its lock, or a permit of it), as the server has it.
async fn held_by(store: &Arc<dyn LockStore>, key: &str, holder: &str) -> bool {
    let key = leasehold::Key::new(key).unwrap();
    match store.inspect(&key).await.unwrap() {
        Some(Inspection::Record(r)) => match &r.permits {
            Some(t) => t.holders.iter().any(|p| p.holder == holder),
            None => r.holder.as_deref() == Some(holder),
        },
        _ => false,
    }
}

/// The lost answer, its retry, and the cut: see the module documentation.
async fn lost_grant_answer(direct: &str, proxied: &str, proxy: &TcpProxy, permit: bool) {
    let what = if permit { "a permit" } else { "a lock" };
    let holder = leasehold_testkit::connect_as(proxied, "holder").await;
    let other = leasehold_testkit::connect_as(direct, "other").await;
    let server = leasehold::open_store(direct).await.unwrap();
    let key = leasehold_testkit::suite::prefix("lost-answer");
    // Connected, and every statement or script the steps use known to the server, before any
    // answer is held.
    for p in [false, true] {
        let warm = format!("{key}-warm-{p}");
        let g = lease(&holder, &warm, p).try_acquire().await.unwrap();
        g.expect("free").release().await.unwrap();
    }

    proxy.hold_answers();
    let taking = tokio::spawn({
        let (holder, key) = (holder.clone(), key.clone());
        async move { lease(&holder, &key, permit).acquire().await }
    });
    let t0 = Instant::now();
    while !held_by(&server, &key, "holder").await {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: never granted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its answer is held past two of the client's call bounds: the client retried (the retries'
    // answers are held too).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    proxy.release_answers(Duration::ZERO);
    let released = Instant::now();
    let guard: LeaseGuard = tokio::time::timeout(Duration::from_secs(10), taking)
        .await
        .unwrap_or_else(|_| panic!("{what}: not granted after the answers came through"))
        .unwrap()
        .unwrap();
    let waited = released.elapsed();
    assert!(
        waited < TTL / 3,
        "{what}: the retry waited {waited:?} for its own grant to expire"
    );

    // Cut off: the holder cannot renew. Another client takes the key as soon as the server frees
    // it, and by then the holder must have stopped counting itself the holder.
    proxy.pause();
    let t1 = Instant::now();
    let taken = loop {
        if let Some(g) = lease(&other, &key, permit).try_acquire().await.unwrap() {
            break g;
        }
        assert!(
            t1.elapsed() < TTL * 3,
            "{what}: never freed after its holder was cut off"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        !guard.is_current(),
        "{what}: granted to another client {:?} after the cut while its holder still counts \
         itself current",
        t1.elapsed()
    );
    proxy.resume();
    taken.release().await.unwrap();
    drop(guard);
}

#[tokio::test]
async fn redis_a_lost_grant_answer_is_renewed_by_its_retry() {
    for permit in [false, true] {
        let server = RedisServer::start();
        let proxy = TcpProxy::start(server.port);
        let direct = format!("redis://127.0.0.1:{}/0", server.port);
        let proxied = format!("redis://127.0.0.1:{}/0?timeout={CALL_TIMEOUT}", proxy.port);
        lost_grant_answer(&direct, &proxied, &proxy, permit).await;
    }
}

#[tokio::test]
async fn postgres_a_lost_grant_answer_is_renewed_by_its_retry() {
    for permit in [false, true] {
        let pg = shared_postgres();
        let direct = pg.fresh_db();
        let proxy = TcpProxy::start(pg.port);
        let proxied = direct.replacen(&format!(":{}/", pg.port), &format!(":{}/", proxy.port), 1)
            + &format!("?timeout={CALL_TIMEOUT}");
        lost_grant_answer(&direct, &proxied, &proxy, permit).await;
    }
}
