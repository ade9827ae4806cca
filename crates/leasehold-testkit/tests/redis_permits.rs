//! Semaphores and read-write locks on Redis: the rules its Lua scripts keep beside
//! `decide/permits.rs`, checked where they are subtle (the conformance suite checks the
//! contracts): the refusal of another kind, a waiting writer ahead of new readers, permits
//! judged by the server's clock, one permit released or renewed beside others, the record as
//! serde reads it back, one script call per step.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::conformance::{expect_granted, expect_held, inspect_record, permit_request};
use leasehold::{
    AcquireOutcome, Error, Key, LockStore, PermitRequest, ReleaseOutcome, RenewOutcome,
};
use leasehold_testkit::servers::{shared_redis, RedisServer};
use std::sync::Arc;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

async fn store(server: &RedisServer) -> Arc<dyn LockStore> {
    leasehold::open_store(&server.url())
        .await
        .expect("redis store")
}

fn key(name: &str) -> Key {
    Key::new(leasehold_testkit::prefix(name)).expect("key")
}

const SEM2: Option<PermitRequest> = Some(PermitRequest::Semaphore { permits: 2 });
const READ: Option<PermitRequest> = Some(PermitRequest::Read);
const WRITE: Option<PermitRequest> = Some(PermitRequest::Write);

/// The holders of `k`'s permit table, by holder id.
async fn holders(store: &Arc<dyn LockStore>, k: &Key) -> Vec<String> {
    let r = inspect_record(store, k).await;
    let t = r.permits.expect("a permit table");
    t.holders.iter().map(|p| p.holder.clone()).collect()
}

fn record_key(k: &Key) -> String {
    format!("leasehold:lock:{}", k.as_str())
}

fn refused(r: leasehold::Result<AcquireOutcome>, is: &str, asked: &str) {
    match r {
        Err(Error::InvalidOption {
            name: "permits",
            reason,
        }) => {
            assert!(reason.contains(&format!("is {is}, with")), "{reason}");
            assert!(
                reason.contains(&format!("asked for as {asked}")),
                "{reason}"
            );
        }
        other => panic!("refused as {is}, asked as {asked}: {other:?}"),
    }
}

/// A key of one kind with a holder refuses every other kind, naming both, from the permit
/// script and from the lock script (alone and batched with other calls); free again, it takes
/// the kind asked, its fences rising.
#[tokio::test]
async fn another_kind_is_refused_while_the_key_is_used() {
    let store = store(shared_redis()).await;
    let k = key("kind");
    let a = expect_granted(&store, &permit_request(&k, "a", SEM2)).await;
    refused(
        store
            .acquire(&permit_request(
                &k,
                "b",
                Some(PermitRequest::Semaphore { permits: 3 }),
            ))
            .await,
        "a semaphore of 2 permits",
        "a semaphore of 3 permits",
    );
    refused(
        store.acquire(&permit_request(&k, "b", WRITE)).await,
        "a semaphore of 2 permits",
        "a read-write lock",
    );
    refused(
        store.acquire(&permit_request(&k, "b", None)).await,
        "a semaphore of 2 permits",
        "a lock",
    );
    // Many lock requests at once: some go out batched, each refused on its own.
    let calls = (0..24).map(|i| {
        let store = store.clone();
        let req = permit_request(&k, &format!("lock-{i}"), None);
        async move { store.acquire(&req).await }
    });
    for r in futures_util::future::join_all(calls).await {
        refused(r, "a semaphore of 2 permits", "a lock");
    }
    assert_eq!(
        store.release(&k, &a.token.unwrap()).await.unwrap(),
        ReleaseOutcome::Released
    );
    // Free: a lock now, and a lock refuses permits while held.
    let lock = expect_granted(&store, &permit_request(&k, "b", None)).await;
    assert!(lock.fence > a.fence);
    refused(
        store.acquire(&permit_request(&k, "c", READ)).await,
        "a lock",
        "a read-write lock",
    );
    store.release(&k, &lock.token.unwrap()).await.unwrap();
    let w = expect_granted(&store, &permit_request(&k, "c", WRITE)).await;
    assert!(w.fence > lock.fence);
    assert!(w.permits.is_some());
}

/// A waiting writer stands in `writers_waiting`; a reader arriving after it waits although
/// only readers hold; the writer withdrawn, the reader is granted.
#[tokio::test]
async fn a_waiting_writer_holds_back_new_readers_until_it_leaves() {
    let store = store(shared_redis()).await;
    let k = key("writer");
    let r1 = expect_granted(&store, &permit_request(&k, "r1", READ)).await;
    assert_eq!(r1.holder.as_deref(), Some("r1"));
    let w = permit_request(&k, "w", WRITE).waiter(Duration::from_secs(10));
    let seen = expect_held(&store, &w).await;
    assert_eq!(seen.holder.as_deref(), Some("r1 (reading)"));
    assert_eq!(seen.waiter.as_deref(), Some("w"));
    let t = inspect_record(&store, &k).await.permits.unwrap();
    assert_eq!(t.writers_waiting, std::slice::from_ref(&w.token));
    // A reader behind it, in line or not, waits.
    expect_held(&store, &permit_request(&k, "r2", READ)).await;
    let r3 = permit_request(&k, "r3", READ).waiter(Duration::from_secs(10));
    let seen = expect_held(&store, &r3).await;
    assert_eq!(seen.queue.len(), 1, "r3 stands behind w: {seen:?}");
    // The writer leaves the line: the readers may share again.
    store.withdraw_waiter(&k, &w.token).await.unwrap();
    let t = inspect_record(&store, &k).await.permits.unwrap();
    assert!(t.writers_waiting.is_empty(), "{t:?}");
    let r3 = expect_granted(&store, &r3).await;
    assert_eq!(holders(&store, &k).await, ["r1", "r3"]);
    assert!(r3.fence > r1.fence);
    assert!(r3.waiter.is_none(), "r3 left the line: {r3:?}");
}

/// Permits are judged by the server's clock, each on its own: a permit written as expired is
/// dropped by the next write, one written as live holds.
#[tokio::test]
async fn permits_lapse_by_the_servers_clock_each_on_its_own() {
    let server = shared_redis();
    let store = store(server).await;
    let k = key("lapsed");
    let now = server_ms(server);
    let permit = |who: &str, expires: u64| {
        format!(
            r#"{{"holder":"{who}","token":"t-{who}","fence":5,"acquired":1,"renewed":1,"expires":{expires},"ttl_ms":1000}}"#
        )
    };
    let raw = format!(
        r#"{{"key":"{}","holder":null,"token":null,"fence":6,"acquired":0,"renewed":0,"expires":0,"ttl_ms":0,"permits":{{"kind":"semaphore","permits":2,"holders":[{},{}]}}}}"#,
        k.as_str(),
        permit("gone", now - 1),
        permit("live", now + 20_000),
    );
    server
        .command(&["SET", &record_key(&k), &raw, "PX", "60000"])
        .unwrap();
    assert_eq!(holders(&store, &k).await, ["gone", "live"], "as written");
    let b = expect_granted(&store, &permit_request(&k, "b", SEM2)).await;
    assert_eq!(holders(&store, &k).await, ["live", "b"]);
    assert_eq!(b.holder.as_deref(), Some("b"), "b's own permit: {b:?}");
    let seen = expect_held(&store, &permit_request(&k, "c", SEM2)).await;
    assert_eq!(seen.holder.as_deref(), Some("live, b (2 of 2 permits)"));
    assert_eq!(seen.expires_ms, now + 20_000, "the earliest expiry");
    // The lapsed one can no longer renew or release.
    assert_eq!(
        store.renew(&k, "t-gone", TTL).await.unwrap(),
        RenewOutcome::Lost(leasehold::LostReason::Released)
    );
    assert_eq!(
        store.release(&k, "t-gone").await.unwrap(),
        ReleaseOutcome::NotHeld
    );
}

/// The server's clock in Unix milliseconds.
fn server_ms(server: &RedisServer) -> u64 {
    let time = server.command(&["TIME"]).unwrap();
    let mut parts = time
        .split_whitespace()
        .filter_map(|s| s.parse::<u64>().ok());
    let (secs, micros) = (parts.next().unwrap(), parts.next().unwrap());
    secs * 1000 + micros / 1000
}

/// Releasing or renewing one permit leaves the others as they were (the lock scripts' fast
/// paths, which find a token in the record's text, must not take a permit record for a lock).
#[tokio::test]
async fn one_permit_released_or_renewed_leaves_the_others() {
    let store = store(shared_redis()).await;
    let k = key("beside");
    let a = permit_request(&k, "a", SEM2);
    let b = permit_request(&k, "b", SEM2);
    let a_rec = expect_granted(&store, &a).await;
    let b_rec = expect_granted(&store, &b).await;
    let renewed = match store.renew(&k, &a.token, TTL * 2).await.unwrap() {
        RenewOutcome::Renewed(r) => r,
        lost => panic!("{lost:?}"),
    };
    assert_eq!(renewed.holder.as_deref(), Some("a"));
    assert_eq!(renewed.fence, a_rec.fence, "a's own fence");
    assert_eq!(renewed.ttl_ms, 60_000);
    let t = inspect_record(&store, &k).await.permits.unwrap();
    assert_eq!(t.holders[1].expires_ms, b_rec.expires_ms, "b's untouched");
    assert_eq!(t.holders[0].ttl_ms, 60_000);
    assert_eq!(
        store.release(&k, &a.token).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(holders(&store, &k).await, ["b"]);
    assert_eq!(
        store.release(&k, &a.token).await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    assert!(matches!(
        store.renew(&k, &b.token, TTL).await.unwrap(),
        RenewOutcome::Renewed(_)
    ));
    store.release(&k, &b.token).await.unwrap();
    assert!(store.inspect(&k).await.unwrap().is_none(), "nothing left");
}

/// A permit table without holders (its waiter still in line) is written as serde reads it
/// back (`"holders":[]`, not cjson's `{}`), and fences from 1e14 up are written exactly.
#[tokio::test]
async fn records_are_written_as_serde_reads_them() {
    let server = shared_redis();
    let store = store(server).await;
    let k = key("shape");
    let big: u64 = (1 << 53) - 100;
    server
        .command(&[
            "SET",
            &format!("leasehold:fence:{}", k.as_str()),
            &big.to_string(),
        ])
        .unwrap();
    let one = Some(PermitRequest::Semaphore { permits: 1 });
    let a = permit_request(&k, "a", one);
    assert_eq!(expect_granted(&store, &a).await.fence, big + 1);
    let b = permit_request(&k, "b", one).waiter(Duration::from_secs(10));
    expect_held(&store, &b).await;
    store.release(&k, &a.token).await.unwrap();
    let raw = server.command(&["GET", &record_key(&k)]).unwrap();
    assert!(raw.contains(r#""holders":[]"#), "{raw}");
    let r = inspect_record(&store, &k).await;
    assert_eq!(r.fence, big + 1, "{raw}");
    assert_eq!(r.waiter.as_deref(), Some("b"));
    assert!(r.permits.unwrap().holders.is_empty());
    let granted_b = expect_granted(&store, &b).await;
    assert_eq!(granted_b.fence, big + 2);
    let raw = server.command(&["GET", &record_key(&k)]).unwrap();
    assert!(raw.contains(&format!(r#""fence":{}"#, big + 2)), "{raw}");
    assert_eq!(
        inspect_record(&store, &k).await.permits.unwrap().holders[0].fence,
        big + 2
    );
}

/// An operator frees one holder, by id or by token, of a permit key or a lock; another
/// client's value is left alone.
#[tokio::test]
async fn one_holder_is_freed_by_id_or_token() {
    let server = shared_redis();
    let store = store(server).await;
    let k = key("force");
    let a = permit_request(&k, "a", READ);
    expect_granted(&store, &a).await;
    expect_granted(&store, &permit_request(&k, "b", READ)).await;
    expect_granted(&store, &permit_request(&k, "b", READ)).await;
    let was = store.force_release_holder(&k, "b").await.unwrap();
    assert_eq!(was.unwrap().permits.unwrap().holders.len(), 3);
    assert_eq!(holders(&store, &k).await, ["a"]);
    assert!(store.force_release_holder(&k, "b").await.unwrap().is_none());
    assert!(store
        .force_release_holder(&k, &a.token)
        .await
        .unwrap()
        .is_some());
    assert!(store.inspect(&k).await.unwrap().is_none());
    // A lock, by its holder's id.
    let lock = permit_request(&k, "l", None);
    expect_granted(&store, &lock).await;
    assert!(store.force_release_holder(&k, "m").await.unwrap().is_none());
    assert!(store.force_release_holder(&k, "l").await.unwrap().is_some());
    assert_eq!(
        store.renew(&k, &lock.token, TTL).await.unwrap(),
        RenewOutcome::Lost(leasehold::LostReason::Released)
    );
    // Every holder at once.
    expect_granted(&store, &permit_request(&k, "a", SEM2)).await;
    expect_granted(&store, &permit_request(&k, "b", SEM2)).await;
    assert!(store.force_release(&k).await.unwrap().is_some());
    assert!(store.inspect(&k).await.unwrap().is_none());
    // Another client's value.
    server
        .command(&["SET", &record_key(&k), "someone-elses-token", "PX", "60000"])
        .unwrap();
    assert!(store.force_release_holder(&k, "a").await.unwrap().is_none());
    assert!(matches!(
        store.acquire(&permit_request(&k, "a", SEM2)).await.unwrap(),
        AcquireOutcome::Held(_)
    ));
}

/// An uncontended permit costs one script call to take, one to renew, one to release (on a
/// server of its own, so that other tests' calls are not counted).
#[tokio::test]
async fn an_uncontended_permit_costs_one_script_call_a_step() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let k = key("calls");
    // The scripts loaded (the first call of each is answered NOSCRIPT and sent again).
    let warm = permit_request(&k, "warm", SEM2);
    expect_granted(&store, &warm).await;
    store.renew(&k, &warm.token, TTL).await.unwrap();
    store.release(&k, &warm.token).await.unwrap();
    let a = permit_request(&k, "a", SEM2);
    let before = server.script_calls();
    expect_granted(&store, &a).await;
    assert_eq!(server.script_calls() - before, 1, "acquire");
    store.renew(&k, &a.token, TTL).await.unwrap();
    assert_eq!(server.script_calls() - before, 2, "renew");
    store.release(&k, &a.token).await.unwrap();
    assert_eq!(server.script_calls() - before, 3, "release");
    assert_eq!(server.command_stat("publish", "calls"), 0, "nobody waited");
}
