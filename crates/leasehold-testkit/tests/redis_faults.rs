//! Redis-specific behaviour against real servers: operator DEL and overwrite, a server that stops
//! answering, the record as operators see it with redis-cli, prefixes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{LeaseGuard, Locks, LostReason, Released};
use leasehold_testkit::servers::{shared_redis, GarbageServer, Pausable, RedisServer, LOCKER_ACL};
use leasehold_testkit::{answered_at_once, refused_then_accepted, taken_and_released};
use std::time::{Duration, Instant};

/// Held by each test that starts a Sentinel deployment of its own and fails it over: they run
/// one at a time. A failover's timing (sentinels that judge a primary down after 500 ms, a holder
/// whose 2 s lease must be renewed on the promoted primary before its replicated record expires
/// there) should not depend on how many other deployments share the machine's two cores.
static SENTINELS_ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn locks(url: &str, holder: &str) -> Locks {
    leasehold_testkit::connect_as(url, holder).await
}

#[tokio::test]
async fn operator_del_and_overwrite_fire_lost_at_the_next_renewal() {
    let server = shared_redis();
    let l = locks(&server.url(), "a").await;
    let key = leasehold_testkit::prefix("del");
    let g = l
        .lock(&key)
        .unwrap()
        .ttl(Duration::from_millis(900))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(server
        .command(&["DEL", &format!("leasehold:lock:{key}")])
        .unwrap()
        .starts_with(":1"));
    let reason = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::Released);

    let key2 = leasehold_testkit::prefix("overwrite");
    let g2 = l
        .lock(&key2)
        .unwrap()
        .ttl(Duration::from_millis(900))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    server
        .command(&["SET", &format!("leasehold:lock:{key2}"), "garbage"])
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), g2.lost())
        .await
        .expect("lost fires");
    assert!(matches!(reason, LostReason::TakenOver { .. }), "{reason:?}");
    // A value leasehold cannot read is reported as held by an unknown holder, until the server
    // expires it (without a TTL, until it is deleted); no acquire replaces it.
    let seen = l.store().inspect(g2.key()).await.unwrap();
    assert!(
        matches!(&seen, Some(leasehold::Inspection::Record(r)) if r.holder.as_deref() == Some("unknown (foreign value: a string of 7 bytes; no TTL: held until deleted)")),
        "{seen:?}"
    );
    let other = locks(&server.url(), "b").await;
    assert!(other
        .lock(&key2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_none());
}

/// Takes a lease of 1.5 s through `l`, calls `fault`, and checks that `lost()` fires, as
/// unreachable, before the TTL counted from the grant runs out; the guard.
async fn lost_before_the_ttl(l: &Locks, fault: impl FnOnce()) -> LeaseGuard {
    let ttl = Duration::from_millis(1500);
    let g = leasehold_testkit::take(l, "job", ttl).await;
    let acquired = Instant::now();
    fault();
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost fires");
    let at = acquired.elapsed();
    assert!(
        matches!(reason, LostReason::Unreachable { .. }),
        "{reason:?}"
    );
    assert!(
        at < ttl,
        "lost fired after {at:?}, at or past the {ttl:?} TTL"
    );
    g
}

#[tokio::test]
async fn a_server_that_stops_answering_fires_lost_before_the_ttl() {
    let server = RedisServer::start();
    let url = format!("{}?timeout=200ms", server.url());
    let l = locks(&url, "a").await;
    let g = lost_before_the_ttl(&l, || server.pause()).await;
    server.resume();
    assert!(!g.is_current());
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error_naming_the_store() {
    let port = leasehold_testkit::servers::free_port();
    let err = leasehold::open_store(&format!("redis://127.0.0.1:{port}/0?timeout=300ms"))
        .await
        .expect_err("nothing listens");
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains(&port.to_string()), "{err}");
    for bad in [
        "redis://127.0.0.1:1/0?colour=red",
        "redis://127.0.0.1:1/0?timeout=soon",
    ] {
        assert!(
            matches!(
                leasehold::open_store(bad).await,
                Err(leasehold::Error::InvalidUrl { .. })
            ),
            "{bad}"
        );
    }
    let clash = format!("{}?prefix=a:&fence_prefix=a:fence:", shared_redis().url());
    assert!(matches!(
        leasehold::open_store(&clash).await,
        Err(leasehold::Error::InvalidOption { .. })
    ));
}

#[tokio::test]
async fn operators_read_the_record_with_redis_cli_and_prefixes_apply() {
    let server = shared_redis();
    let url = format!("{}?prefix=agent:lock:", server.url());
    let l = locks(&url, "pod-7").await;
    let key = leasehold_testkit::prefix("agent");
    let g = l
        .lock(&key)
        .unwrap()
        .label("task", "t1")
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let got = server
        .command(&["GET", &format!("agent:lock:{key}")])
        .unwrap();
    for field in [
        "\"holder\":\"pod-7\"",
        "\"fence\":",
        "\"expires\":",
        "\"task\":\"t1\"",
    ] {
        assert!(got.contains(field), "{field} missing in {got}");
    }
    let pttl = server
        .command(&["PTTL", &format!("agent:lock:{key}")])
        .unwrap();
    let ms: i64 = pttl.trim().trim_start_matches(':').parse().unwrap();
    assert!(ms > 29_000 && ms <= 30_000, "{pttl}");
    let fence = server
        .command(&["GET", &format!("agent:fence:{key}")])
        .unwrap();
    assert!(fence.contains(&g.fence().to_string()), "{fence}");
    // Force release by DEL, as operators do today; the next holder's fence is still higher.
    server
        .command(&["DEL", &format!("agent:lock:{key}")])
        .unwrap();
    let g2 = locks(&url, "pod-8")
        .await
        .lock(&key)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(g2.fence() > g.fence());
    g2.release().await.unwrap();
    drop(g);
}

/// A contender waiting up to 10 s for `key` through `l`, registered as waiter or only subscribed:
/// its guard, and when it got it.
type Waiter = tokio::task::JoinHandle<(leasehold::Result<LeaseGuard>, Instant)>;

fn spawn_waiter(l: Locks, key: &str, register: bool) -> Waiter {
    spawn_waiter_for(l, key, register, Duration::from_secs(10))
}

/// [`spawn_waiter`] with a wait limit of `wait`.
fn spawn_waiter_for(l: Locks, key: &str, register: bool, wait: Duration) -> Waiter {
    let key = key.to_owned();
    tokio::spawn(async move {
        let g = l
            .lock(&key)
            .unwrap()
            .register_waiter(register)
            .wait(wait)
            .acquire()
            .await;
        (g, Instant::now())
    })
}

/// The record of `key` as `redis-cli GET` returns it (empty if there is none).
fn record(server: &leasehold_servers::RedisServer, key: &str) -> String {
    server
        .command(&["GET", &format!("leasehold:lock:{key}")])
        .unwrap_or_default()
}

/// Waits until a contender for `key` is subscribed to its channel and its attempt left `mark` in
/// the record (`"waiter_token":"` when registered, `"watched":true` when only subscribed).
async fn await_waiting(server: &leasehold_servers::RedisServer, key: &str, mark: &str) {
    let channel = format!("leasehold:lock:{key}");
    let subscribed = || {
        // `PUBSUB NUMSUB channel` answers the channel and its subscriber count (`:N`).
        server
            .command(&["PUBSUB", "NUMSUB", &channel])
            .unwrap_or_default()
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(':'))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(subscribed() && record(server, key).contains(mark)) {
        assert!(
            Instant::now() < deadline,
            "no subscribed contender left {mark} in {}",
            record(server, key)
        );
        tokio::task::yield_now().await;
    }
}

/// Releases `g` and checks that `waiter` got the lease within 100 ms of it: woken by the release's
/// pub/sub message, not by the 500 ms safety-net timer. Then releases the waiter's lease.
async fn release_wakes(g: LeaseGuard, waiter: Waiter, who: &str) {
    let released = Instant::now();
    g.release().await.unwrap();
    let (gw, got) = waiter.await.unwrap();
    let latency = got.duration_since(released);
    assert!(
        latency < Duration::from_millis(100),
        "{who} took {latency:?} after the release (the 500 ms timer, not pub/sub)"
    );
    gw.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_is_woken_by_pub_sub_not_by_polling() {
    let server = shared_redis();
    // Registered as waiter, and merely subscribed (its attempt marks the record "watched").
    for register in [true, false] {
        let a = locks(&server.url(), "a").await;
        let b = locks(&server.url(), "b").await;
        let key = leasehold_testkit::prefix("wake");
        let g = a.lock(&key).unwrap().try_acquire().await.unwrap().unwrap();
        let waiter = spawn_waiter(b, &key, register);
        let mark = if register {
            "\"waiter_token\":\""
        } else {
            "\"watched\":true"
        };
        await_waiting(server, &key, mark).await;
        release_wakes(g, waiter, &format!("the waiter (registered: {register})")).await;
    }
}

/// A lease taken over a record that a subscribed contender marked "watched" keeps the mark, so its
/// release still wakes that contender (not the 500 ms safety-net timer).
#[tokio::test]
async fn the_watched_mark_outlives_a_handoff() {
    let server = shared_redis();
    let url = server.url();
    let key = leasehold_testkit::prefix("watched-handoff");
    let h = locks(&url, "h").await;
    let held = h.lock(&key).unwrap().try_acquire().await.unwrap().unwrap();
    // X registers as the waiter; Y, who cannot register too, only subscribes and marks.
    let x = spawn_waiter(locks(&url, "x").await, &key, true);
    await_waiting(server, &key, "\"waiter_token\":\"").await;
    let y = spawn_waiter(locks(&url, "y").await, &key, false);
    await_waiting(server, &key, "\"watched\":true").await;
    held.release().await.unwrap();
    let gx = x.await.unwrap().0.unwrap();
    let now = record(server, &key);
    assert!(
        now.contains("\"holder\":\"x\"") && now.contains("\"watched\":true"),
        "X's record lost the mark: {now}"
    );
    release_wakes(gx, y, "Y").await;
}

/// Nobody waits: acquire and release publish nothing.
#[tokio::test]
async fn an_uncontended_release_publishes_nothing() {
    let server = RedisServer::start();
    let a = locks(&server.url(), "a").await;
    for _ in 0..10 {
        let g = a
            .lock("quiet")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .unwrap();
        assert_eq!(g.release().await.unwrap(), Released::Released);
    }
    let info = server
        .command(&["INFO", "commandstats"])
        .unwrap_or_default();
    assert!(
        !info.contains("cmdstat_publish:"),
        "an uncontended release published: {info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_stay_alive_with_batched_renewals() {
    let server = RedisServer::start();
    let l = locks(&server.url(), "many").await;
    let ttl = Duration::from_millis(2000);
    let guards = leasehold_testkit::take_many(&l, "many", 10_000, ttl).await;
    let before = server.script_calls();
    tokio::time::sleep(Duration::from_millis(3000)).await; // 1.5 TTLs, 4.5 renewal periods
    let calls = server.script_calls() - before;
    let current = guards.iter().filter(|g| g.is_current()).count();
    assert_eq!(current, 10_000, "leases lost while renewing");
    // Unbatched, 4.5 renewal periods would be ~45,000 renewal calls.
    eprintln!("{calls} script calls renewed 10,000 leases for 3 s");
    assert!(
        calls < 2_000,
        "{calls} script calls: renewals are not batched"
    );
    let k = leasehold::Key::new("many/9999").unwrap();
    assert!(locks(&server.url(), "other")
        .await
        .lock_key(k)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    // Under a loaded CI machine a few leases can lapse while 10,000 releases queue up; what
    // matters is that none is left held.
    let released = l.release_all().await.unwrap();
    assert!(released > 9_000, "release_all released only {released}");
    assert_eq!(
        server
            .command(&["KEYS", "leasehold:lock:many/*"])
            .as_deref(),
        Some("*0\r\n"),
        "leases left held after release_all"
    );
}

#[tokio::test]
async fn tls_needs_a_trusted_certificate() {
    let server = RedisServer::start_tls();
    // Our CA: works (the conformance suite runs over rediss:// too).
    assert!(leasehold::open_store(&server.url()).await.is_ok());
    // The system trust store does not know the test CA: a clear, non-panicking error.
    let plain = format!("rediss://127.0.0.1:{}/0?timeout=500ms", server.port);
    let err = leasehold::open_store(&plain)
        .await
        .expect_err("untrusted certificate");
    eprintln!("{err}");
    // Plain redis:// against a TLS port does not hang either.
    let wrong = format!("redis://127.0.0.1:{}/0?timeout=300ms", server.port);
    assert!(leasehold::open_store(&wrong).await.is_err());
    let no_tls = format!("redis://127.0.0.1:{}/0?ca=/nonexistent", server.port);
    assert!(matches!(
        leasehold::open_store(&no_tls).await,
        Err(leasehold::Error::InvalidUrl { .. })
    ));
}

/// A server that asks for a client certificate (`tls-auth-clients yes`, Redis's default with
/// TLS): `?cert=&key=` give it ours; without them the handshake fails for good (non-retryable);
/// the two go together, only on `rediss://`, and a missing file is an error naming it.
#[tokio::test]
async fn mutual_tls_presents_the_client_certificate() {
    let server = leasehold_testkit::servers::shared_redis_mtls();
    let url = server.url();
    let l = locks(&url, "mtls").await;
    let key = leasehold_testkit::prefix("mtls");
    let g = l.lock(&key).unwrap().try_acquire().await.unwrap().unwrap();
    assert!(g.fence() >= 1);
    g.release().await.unwrap();
    let (ca_only, _) = url.split_once("&cert=").unwrap();
    let without = format!("{ca_only}&timeout=500ms");
    let refused = match leasehold::open_store(&without).await {
        Err(e) => e,
        Ok(store) => {
            let req = leasehold::AcquireRequest::new(
                leasehold::Key::new("k").unwrap(),
                "h",
                Duration::from_secs(1),
            );
            store
                .acquire(&req)
                .await
                .expect_err("no client certificate")
        }
    };
    // The server's "certificate required" alert: retrying does not heal it.
    assert!(!refused.is_retryable(), "{refused}");
    let cert_only = url.split("&key=").next().unwrap().to_owned();
    assert!(matches!(
        leasehold::open_store(&cert_only).await,
        Err(leasehold::Error::InvalidUrl { .. })
    ));
    let plain = format!(
        "redis://127.0.0.1:{}/0?{}",
        server.port,
        url.split_once("&cert=")
            .map(|(_, c)| format!("cert={c}"))
            .unwrap()
    );
    assert!(matches!(
        leasehold::open_store(&plain).await,
        Err(leasehold::Error::InvalidUrl { .. })
    ));
    let missing = format!("{ca_only}&cert=/nonexistent/c.crt&key=/nonexistent/c.key");
    assert!(matches!(
        leasehold::open_store(&missing).await,
        Err(leasehold::Error::Io { .. })
    ));
}

#[tokio::test]
async fn a_server_that_answers_garbage_is_an_error_not_a_panic() {
    let garbage = leasehold_testkit::servers::GarbageServer::start();
    let url = format!("redis://127.0.0.1:{}/0?timeout=300ms", garbage.port);
    match leasehold::open_store(&url).await {
        Err(e) => eprintln!("connect: {e}"),
        Ok(store) => {
            let req = leasehold::AcquireRequest::new(
                leasehold::Key::new("k").unwrap(),
                "h",
                Duration::from_secs(1),
            );
            let err = store
                .acquire(&req)
                .await
                .expect_err("garbage is not a grant");
            eprintln!("acquire: {err}");
        }
    }
}

/// The connection manager keeps a connection it could not make for a reason other than I/O (it
/// connects again only after an I/O error), so the store connects anew itself: a server back on
/// a port where something that is not Redis answered meanwhile is used again by the next call.
#[tokio::test]
async fn a_server_back_on_a_port_that_answered_garbage_is_used_again() {
    let mut server = RedisServer::start();
    let port = server.port;
    // Longer than the connection manager's own retries: the failure it keeps is then the
    // unreadable answer, not a call that ran out of time (after which the store connects anew
    // anyway).
    let l = locks(&format!("{}?timeout=3s", server.url()), "a").await;
    taken_and_released(&l).await;
    server.stop();
    let garbage = GarbageServer::start_on(port);
    // Until the connection made again after the stop has reached the garbage.
    let mut tries = 0;
    loop {
        let err = l
            .lock("job")
            .unwrap()
            .try_acquire()
            .await
            .expect_err("garbage is not a grant");
        if err.to_string().contains("not Redis") {
            assert!(!err.is_retryable(), "{err}");
            break;
        }
        tries += 1;
        assert!(tries < 50, "never told the garbage apart: {err}");
    }
    drop(garbage);
    let _back = RedisServer::start_on(port);
    taken_and_released(&l).await;
}

/// Refused credentials fail calls at once (a waiter does not wait out its limit); once the
/// server accepts them (a user provisioned late, a password rotated on the server last), the next
/// call connects anew and goes through.
#[tokio::test]
async fn credentials_accepted_again_are_used_again() {
    let server = RedisServer::start_with_users(&[LOCKER_ACL]);
    let url = format!(
        "redis://locker:s3cret@127.0.0.1:{}/0?timeout=3s",
        server.port
    );
    refused_then_accepted(&locks(&url, "a").await, &[&server], true).await;
}

/// Under Sentinel too: refused credentials on the primary fail calls at once; once it accepts
/// them, the next call connects anew (to the primary the sentinels name) and goes through.
#[tokio::test]
async fn a_sentinel_primary_that_accepts_the_credentials_again_is_used_again() {
    let set = leasehold_testkit::servers::SentinelSet::start();
    // The README's line, plus `ROLE` (the store checks that the server the sentinels name is
    // the primary).
    let rule = format!("{LOCKER_ACL} +role");
    let mut args = vec!["ACL", "SETUSER"];
    args.extend(rule.split(' '));
    for server in &set.servers {
        assert!(server.command(&args).is_some_and(|r| r.starts_with("+OK")));
    }
    let url = set
        .url()
        .replacen("redis+sentinel://", "redis+sentinel://locker:s3cret@", 1);
    let l = locks(&format!("{url}?timeout=2s"), "a").await;
    let primary = set
        .primary_port()
        .and_then(|p| set.server(p))
        .expect("a primary");
    refused_then_accepted(&l, &[primary], false).await;
}

/// The record of a granted acquisition.
fn granted(outcome: leasehold::AcquireOutcome) -> leasehold::LeaseRecord {
    match outcome {
        leasehold::AcquireOutcome::Granted(r) => r,
        other => panic!("not granted: {other:?}"),
    }
}

/// The record stored for `key`.
async fn stored(store: &dyn leasehold::LockStore, key: &leasehold::Key) -> leasehold::LeaseRecord {
    match store.inspect(key).await.unwrap() {
        Some(leasehold::Inspection::Record(r)) => r,
        other => panic!("no record: {other:?}"),
    }
}

/// The record a free key's grant returns (built by the client from its request, the fence and the
/// server's time) is the record stored, field for field, labels and odd characters included.
#[tokio::test]
async fn a_fast_grant_returns_the_stored_record() {
    let server = shared_redis();
    let store = leasehold::open_store(&server.url()).await.unwrap();
    let key = leasehold::Key::new(leasehold_testkit::prefix("fast-grant/\"q\"\\é")).unwrap();
    let mut req = leasehold::AcquireRequest::new(key.clone(), "höst \"x\"", Duration::from_secs(5));
    req.labels.insert("task".into(), "a\"b\\c\u{1}".into());
    let before = server_ms(server);
    let granted = granted(store.acquire(&req).await.unwrap());
    let after = server_ms(server);
    assert_eq!(granted, stored(&*store, &key).await);
    // Stamped with the server's time (the script builds it from TIME's strings).
    assert!(
        (before..=after).contains(&granted.acquired_ms),
        "acquired {} not within the server's {before}..={after}",
        granted.acquired_ms
    );
    assert_eq!(granted.renewed_ms, granted.acquired_ms);
    assert_eq!(granted.expires_ms, granted.acquired_ms + 5000);
    store.release(&key, &req.token).await.unwrap();
}

/// Acquisitions and releases made together share script calls (each answered on its own, as
/// separate calls would be): 64 acquisitions on one store at once take a few calls, not 64. One
/// of them meets a fence counter an operator overwrote, and gets its own error (the one a lone
/// call gets), while the others in its call are granted; one finds its key held and is told so.
#[tokio::test]
async fn concurrent_calls_share_script_calls_and_keep_their_own_answers() {
    let server = RedisServer::start();
    let store = leasehold::open_store(&server.url()).await.unwrap();
    let stem = leasehold_testkit::prefix("coalesced");
    let keys: Vec<leasehold::Key> = (0..64)
        .map(|i| leasehold::Key::new(format!("{stem}/{i}")).unwrap())
        .collect();
    let (broken, held) = (10, 20);
    let fence_key = format!("leasehold:fence:{}", keys[broken].as_str());
    server
        .command(&["SET", &fence_key, "not a number"])
        .unwrap();
    let holder =
        leasehold::AcquireRequest::new(keys[held].clone(), "other", Duration::from_secs(30));
    granted(store.acquire(&holder).await.unwrap());
    let reqs: Vec<_> = keys
        .iter()
        .map(|k| leasehold::AcquireRequest::new(k.clone(), "me", Duration::from_secs(30)))
        .collect();

    let before = server.script_calls();
    let answers = futures_util::future::join_all(reqs.iter().map(|r| store.acquire(r))).await;
    let acquire_calls = server.script_calls() - before;
    // Not one call: a few go out alone while the server is idle, and `join_all` polls its futures
    // 32 at a time, letting answers in between.
    assert!(
        acquire_calls < 16,
        "64 acquisitions took {acquire_calls} script calls"
    );
    let mut granted_keys = vec![];
    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer) {
            (i, Err(e)) if i == broken => {
                assert!(e.to_string().contains("not an integer"), "{e}");
                assert!(!e.is_retryable(), "{e}");
            }
            (i, Ok(leasehold::AcquireOutcome::Held(r))) if i == held => {
                assert_eq!(r.holder.as_deref(), Some("other"));
            }
            (i, Ok(leasehold::AcquireOutcome::Granted(r))) if i != broken && i != held => {
                assert_eq!(r, stored(&*store, &keys[i]).await);
                granted_keys.push(i);
            }
            (i, other) => panic!("key {i}: {other:?}"),
        }
    }
    assert_eq!(granted_keys.len(), 62);
    // A lone call on the broken key gets the same error.
    let alone = store
        .acquire(&reqs[broken])
        .await
        .expect_err("the fence counter is broken");
    assert!(alone.to_string().contains("not an integer"), "{alone}");
    assert!(!alone.is_retryable(), "{alone}");

    let before = server.script_calls();
    let released = futures_util::future::join_all(
        granted_keys
            .iter()
            .map(|&i| store.release(&keys[i], &reqs[i].token)),
    )
    .await;
    let release_calls = server.script_calls() - before;
    assert!(
        release_calls < 16,
        "62 releases took {release_calls} script calls"
    );
    for (i, r) in granted_keys.iter().zip(released) {
        assert_eq!(r.unwrap(), leasehold::ReleaseOutcome::Released, "key {i}");
        assert!(store.inspect(&keys[*i]).await.unwrap().is_none(), "key {i}");
    }
    // Not ours: refused, together as alone.
    let refused =
        futures_util::future::join_all((0..8).map(|_| store.release(&keys[held], "not-the-token")))
            .await;
    for r in refused {
        assert_eq!(r.unwrap(), leasehold::ReleaseOutcome::NotHeld);
    }
    assert_eq!(
        stored(&*store, &keys[held]).await.holder.as_deref(),
        Some("other")
    );
}

/// An acquisition dropped while it waits in the queue for a shared call is never sent: it takes no
/// lease that nobody holds (until its TTL).
#[tokio::test]
async fn an_acquisition_dropped_in_the_queue_is_never_sent() {
    let server = RedisServer::start();
    let store = leasehold::open_store(&server.url()).await.unwrap();
    let stem = leasehold_testkit::prefix("abandoned");
    let reqs = requests(&stem, 8, Duration::from_secs(30));
    // The scripts loaded, so that a batch takes one round trip (a first one reloads on NOSCRIPT).
    let warm = requests(&format!("{stem}/warm"), 8, Duration::from_secs(30));
    for answer in futures_util::future::join_all(warm.iter().map(|r| store.acquire(r))).await {
        granted(answer.unwrap());
    }
    {
        // Polled once: the first four go out on their own, the other four queue. Then dropped.
        let mut all = std::pin::pin!(futures_util::future::join_all(
            reqs.iter().map(|r| store.acquire(r))
        ));
        tokio::select! {
            biased;
            _ = &mut all => panic!("answered before the server could be asked"),
            () = std::future::ready(()) => {}
        }
    }
    // Round trips on the same connection: whatever the drop sent has reached the server.
    for _ in 0..3 {
        store.inspect(&reqs[0].key).await.unwrap();
    }
    for r in &reqs[4..] {
        let counter = format!("leasehold:fence:{}", r.key.as_str());
        assert_eq!(
            server.command(&["EXISTS", &counter]).as_deref(),
            Some(":0\r\n"),
            "{counter} was incremented"
        );
        assert!(
            store.inspect(&r.key).await.unwrap().is_none(),
            "{} taken",
            r.key
        );
    }
}

/// A call queued for a shared script call (four of its kind already wait for the server) is
/// bounded by the store's timeout from the moment it is made, as a lone call is: not by the time
/// the calls ahead of it take to run out of theirs plus its own.
#[tokio::test]
async fn a_queued_call_fails_within_the_stores_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_secs(1);
    let store = leasehold::open_store(&format!("{}?timeout=1s", server.url()))
        .await
        .unwrap();
    let reqs = requests(
        &leasehold_testkit::prefix("queued-timeout"),
        5,
        Duration::from_secs(2),
    );
    // Connected, so that the first calls wait for the server's answer, not for a connection.
    store.inspect(&reqs[0].key).await.unwrap();
    server.pause();
    // The first four go out on their own and hang; the fifth queues behind them.
    let answers = futures_util::future::join_all(reqs.iter().map(|r| async {
        let started = Instant::now();
        (store.acquire(r).await, started.elapsed())
    }))
    .await;
    server.resume();
    for (i, (answer, took)) in answers.into_iter().enumerate() {
        let e = answer.expect_err("the server is stopped");
        assert!(e.is_retryable(), "call {i}: {e}");
        assert!(
            took < timeout + Duration::from_millis(500),
            "call {i} failed after {took:?}, the store's timeout being {timeout:?}"
        );
    }
}

/// `n` acquisitions by "me" of keys `<stem>/0`, `<stem>/1`, … for `ttl`.
fn requests(stem: &str, n: usize, ttl: Duration) -> Vec<leasehold::AcquireRequest> {
    (0..n)
        .map(|i| {
            let key = leasehold::Key::new(format!("{stem}/{i}")).unwrap();
            leasehold::AcquireRequest::new(key, "me", ttl)
        })
        .collect()
}

/// The server's clock in milliseconds, from `TIME`.
fn server_ms(server: &leasehold_servers::RedisServer) -> u64 {
    let reply = server.command(&["TIME"]).unwrap();
    // *2 $n seconds $n microseconds
    let parts: Vec<u64> = reply
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .map(|l| l.trim().parse().unwrap())
        .collect();
    parts[0] * 1000 + parts[1] / 1000
}

/// Scripts go by `EVALSHA`; a server that forgot them (`SCRIPT FLUSH`, a restart) answers
/// `NOSCRIPT`, and every operation sends its call again as `EVAL` with the script and goes on.
#[tokio::test]
async fn a_server_that_forgot_the_scripts_gets_them_again() {
    let server = RedisServer::start();
    let store = leasehold::open_store(&server.url()).await.unwrap();
    let key = leasehold::Key::new("noscript").unwrap();
    let ttl = Duration::from_secs(5);
    let flush = || {
        assert!(server
            .command(&["SCRIPT", "FLUSH"])
            .unwrap()
            .starts_with("+OK"))
    };
    flush();
    let req = leasehold::AcquireRequest::new(key.clone(), "a", ttl);
    let first = granted(store.acquire(&req).await.unwrap());
    flush();
    assert!(matches!(
        store.renew(&key, &req.token, ttl).await.unwrap(),
        leasehold::RenewOutcome::Renewed(_)
    ));
    flush();
    assert_eq!(
        store.release(&key, &req.token).await.unwrap(),
        leasehold::ReleaseOutcome::Released
    );
    flush();
    let again = leasehold::AcquireRequest::new(key.clone(), "b", ttl);
    let second = granted(store.acquire(&again).await.unwrap());
    assert!(second.fence > first.fence);
}

/// Fences past 10^14 stay exact through every path that writes the record: the free-key grant,
/// a waiter's registration and the renewal of a waited-for record (both re-encode the record with
/// Redis's JSON encoder, which keeps 14 significant digits), and a grant over an existing record.
#[tokio::test]
async fn fences_past_ten_to_the_fourteenth_stay_exact() {
    let server = shared_redis();
    let store = leasehold::open_store(&server.url()).await.unwrap();
    let key = leasehold::Key::new(leasehold_testkit::prefix("big-fence")).unwrap();
    let start: u64 = 1_234_567_890_123_456;
    server
        .command(&[
            "SET",
            &format!("leasehold:fence:{}", key.as_str()),
            &start.to_string(),
        ])
        .unwrap();
    let ttl = Duration::from_secs(5);
    let stored_fence = || async { stored(&*store, &key).await.fence };
    let first = leasehold::AcquireRequest::new(key.clone(), "a", ttl);
    assert_eq!(
        granted(store.acquire(&first).await.unwrap()).fence,
        start + 1
    );
    let waiter = leasehold::AcquireRequest::new(key.clone(), "b", ttl).waiter(ttl);
    match store.acquire(&waiter).await.unwrap() {
        leasehold::AcquireOutcome::Held(r) => assert_eq!(r.fence, start + 1),
        other => panic!("not held: {other:?}"),
    }
    assert_eq!(stored_fence().await, start + 1);
    match store.renew(&key, &first.token, ttl).await.unwrap() {
        leasehold::RenewOutcome::Renewed(r) => assert_eq!(r.fence, start + 1),
        other => panic!("not renewed: {other:?}"),
    }
    assert_eq!(stored_fence().await, start + 1);
    store.release(&key, &first.token).await.unwrap();
    assert_eq!(
        granted(store.acquire(&waiter).await.unwrap()).fence,
        start + 2
    );
    assert_eq!(stored_fence().await, start + 2);
    store.release(&key, &waiter.token).await.unwrap();
}

/// `redis-cli` against `server`'s database `db`: the reply's text.
fn redis_cli(server: &leasehold_servers::RedisServer, db: u32, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "-n", &db.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Through `url` (on `server`'s database 0, default prefix): a lease of `key` with a 600 ms TTL
/// outlives two TTLs by renewals, and its release wakes a registered waiter by pub/sub. Returns
/// the holder's and the waiter's [`Locks`] (their connections still open).
async fn renew_and_hand_over(
    server: &leasehold_servers::RedisServer,
    url: &str,
    key: &str,
) -> (Locks, Locks) {
    let a = locks(url, "a").await;
    let b = locks(url, "b").await;
    let g = a
        .lock(key)
        .unwrap()
        .ttl(Duration::from_millis(600))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let waiter = spawn_waiter(b.clone(), key, true);
    await_waiting(server, key, "\"waiter_token\":\"").await;
    // Past two TTLs: renewals went through too.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(g.is_current());
    release_wakes(g, waiter, &format!("the waiter through {url}")).await;
    (a, b)
}

/// A deployment with ACL users: the user and password in the URL are used by every connection
/// (commands and pub/sub), a wrong password is a clear error that does not repeat the password,
/// and a user whose key pattern does not cover the prefix gets a permission error, not a hang.
#[tokio::test]
async fn acl_users_and_passwords_from_the_url() {
    let server =
        RedisServer::start_with_users(&[LOCKER_ACL, "agents on >pw2 ~agent:* &agent:* +@all"]);
    let url =
        |cred: &str, query: &str| format!("redis://{cred}@127.0.0.1:{}/0{query}", server.port);

    // Commands, renewals and pub/sub all run as `locker`.
    let (a, _b) = renew_and_hand_over(&server, &url("locker:s3cret", ""), "acl").await;
    let key = "acl";
    // Listing, inspection, force-release and a withdrawn waiter (its wait runs out).
    let held = a.lock(key).unwrap().try_acquire().await.unwrap().unwrap();
    let c = locks(&url("locker:s3cret", ""), "c").await;
    let gave_up = c
        .lock(key)
        .unwrap()
        .register_waiter(true)
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(gave_up.is_err());
    assert_eq!(a.store().list("").await.unwrap().len(), 1);
    assert!(a.store().inspect(held.key()).await.unwrap().is_some());
    assert!(a.store().force_release(held.key()).await.unwrap().is_some());
    drop(held);
    // Nothing was refused along the way, not even a call whose error went unseen.
    assert_eq!(redis_cli(&server, 0, &["ACL", "LOG"]), "");
    // leasehold's connections (the test's own `redis-cli` and probes use the default user): the
    // ones that ran scripts and the pub/sub one all run as `locker`.
    let clients = redis_cli(&server, 0, &["CLIENT", "LIST"]);
    let ours: Vec<&str> = clients
        .lines()
        .filter(|l| {
            ["cmd=evalsha", "cmd=script", "subscribe"]
                .iter()
                .any(|c| l.contains(c))
        })
        .collect();
    assert!(
        ours.iter().any(|l| l.contains("subscribe")) && ours.iter().any(|l| l.contains("evalsha")),
        "no script or pub/sub connection of leasehold's: {clients}"
    );
    assert!(
        ours.iter().all(|l| l.contains("user=locker")),
        "a connection did not authenticate as locker: {clients}"
    );

    // A wrong password: refused at connect, not retryable, the password not in the message.
    let err = leasehold::open_store(&url("locker:wrong-pw", "?timeout=500ms"))
        .await
        .expect_err("wrong password");
    let text = err.to_string();
    assert!(!err.is_retryable(), "{text}");
    assert!(!text.contains("wrong-pw"), "{text}");
    assert!(
        text.to_lowercase().contains("auth") || text.contains("WRONGPASS"),
        "{text}"
    );

    // A user restricted to `agent:*` cannot use the default prefix ...
    let outside = leasehold::open_store(&url("agents:pw2", "")).await.unwrap();
    let req = leasehold::AcquireRequest::new(
        leasehold::Key::new("k").unwrap(),
        "h",
        Duration::from_secs(1),
    );
    let err = outside.acquire(&req).await.expect_err("no permission");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("permission"), "{err}");
    // ... but can with its own (the fence prefix follows: `agent:fence:`).
    let inside = locks(&url("agents:pw2", "?prefix=agent:lock:"), "c").await;
    let g = inside
        .lock("k")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(redis_cli(&server, 0, &["GET", "agent:lock:k"]).contains("\"holder\":\"c\""));
    assert_eq!(
        redis_cli(&server, 0, &["GET", "agent:fence:k"]),
        g.fence().to_string()
    );
    g.release().await.unwrap();
}

/// The database number in the URL is where records and fence counters live.
#[tokio::test]
async fn the_database_number_in_the_url_selects_the_database() {
    let server = shared_redis();
    let key = leasehold_testkit::prefix("db");
    let l = locks(&format!("redis://127.0.0.1:{}/3", server.port), "d").await;
    let g = l.lock(&key).unwrap().try_acquire().await.unwrap().unwrap();
    let name = format!("leasehold:lock:{key}");
    assert!(redis_cli(server, 3, &["GET", &name]).contains("\"holder\":\"d\""));
    assert_eq!(redis_cli(server, 0, &["EXISTS", &name]), "0");
    assert_eq!(
        redis_cli(server, 3, &["GET", &format!("leasehold:fence:{key}")]),
        g.fence().to_string()
    );
    g.release().await.unwrap();
    assert_eq!(redis_cli(server, 3, &["EXISTS", &name]), "0");
}

/// A server restarted empty while a lease is held and a contender waits: the holder's `lost()`
/// fires, the waiter gets the lease, and its fence starts again from 1 — the documented case of a
/// Redis fence going backwards (the counter key was lost). The store reconnects by itself, and
/// pub/sub works again: a later release still wakes its waiter at once.
#[tokio::test]
async fn a_server_restarted_empty_reconnects_and_its_fences_start_again() {
    let mut server = RedisServer::start();
    let port = server.port;
    let url = format!("{}?timeout=300ms", server.url());
    let (a, b) = (locks(&url, "a").await, locks(&url, "b").await);
    assert!(server
        .command(&["SET", "leasehold:fence:job", "41"])
        .unwrap()
        .starts_with("+OK"));
    let g = a
        .lock("job")
        .unwrap()
        .ttl(Duration::from_millis(1000))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(g.fence(), 42);
    let waiter = spawn_waiter(b.clone(), "job", true);
    await_waiting(&server, "job", "\"waiter_token\":\"").await;

    server.stop();
    server = RedisServer::start_on(port);
    let reason = tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost fires");
    assert!(
        matches!(
            reason,
            LostReason::Released | LostReason::Unreachable { .. } | LostReason::TakenOver { .. }
        ),
        "{reason:?}"
    );
    let (gw, _) = waiter.await.unwrap();
    let gw = gw.expect("the waiter gets the lease after the restart");
    assert_eq!(gw.fence(), 1, "the counter restarted with the server");
    assert!(record(&server, "job").contains("\"holder\":\"b\""));
    gw.release().await.unwrap();

    // Pub/sub is back: a release wakes a waiter within 100 ms, not by the timer.
    let g = a
        .lock("after")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let waiter = spawn_waiter(b, "after", true);
    await_waiting(&server, "after", "\"waiter_token\":\"").await;
    release_wakes(g, waiter, "a waiter after the restart").await;
}

/// A server that stops answering while contenders wait: their wait limits hold to the limit, not
/// the limit plus the store's 2 s call timeout (every call to the server is bounded by the wait
/// limit, the pub/sub subscription included); once the server answers again, what the abandoned
/// calls did is undone: a lease granted after its caller left is released, a waiter registration
/// withdrawn.
#[tokio::test]
async fn a_wait_limit_holds_when_the_server_stops_answering() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = locks(&url, "h").await;
    let g = holder
        .lock("job")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let contender = locks(&url, "c").await;
    // The contender's pub/sub connection exists already (it waited for a key before).
    let other = holder
        .lock("other")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let waited = contender
        .lock("other")
        .unwrap()
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(waited.is_err());
    drop(other);
    server.pause();
    let limit = Duration::from_millis(500);
    let wait_for = |key: &'static str| {
        let contender = contender.clone();
        async move {
            let started = Instant::now();
            let got = tokio::time::timeout(
                Duration::from_secs(5),
                contender.lock(key).unwrap().wait(limit).acquire(),
            )
            .await;
            (got, started.elapsed())
        }
    };
    // A held key (the attempt would register as its waiter) and a free one (it would be granted).
    let ((held, took_held), (free, took_free)) = tokio::join!(wait_for("job"), wait_for("free"));
    server.resume();
    for (key, got, took) in [("job", held, took_held), ("free", free, took_free)] {
        let got = got.expect("the wait limit did not hold: acquire still waiting after 5 s");
        assert!(
            matches!(got, Err(leasehold::Error::Timeout { .. })),
            "{key}: {got:?}"
        );
        assert!(
            took < Duration::from_millis(1200),
            "{key}: took {took:?} for a {limit:?} limit"
        );
    }
    // The calls the server answers late are undone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let undone = || {
        !record(&server, "free").contains("\"token\"")
            && record(&server, "job").contains("\"waiter_token\":null")
    };
    while !undone() {
        assert!(
            Instant::now() < deadline,
            "abandoned calls not undone: free = {:?}, job = {:?}",
            record(&server, "free"),
            record(&server, "job")
        );
        tokio::task::yield_now().await;
    }
    assert!(
        server
            .command(&["GET", "leasehold:fence:free"])
            .unwrap_or_default()
            .contains('1'),
        "the late grant of free did happen (fence 1)"
    );
    let again = contender.lock("free").unwrap().try_acquire().await.unwrap();
    assert!(again.is_some(), "free is free again");
    drop(g);
}

/// `redis+unix://`: a server reached through its Unix socket, with the database, ACL user and
/// password as the redis crate takes them (`?db=…&user=…&pass=…`) next to leasehold's own
/// parameters; the password never shows in a message; a socket that is not there is a retryable
/// error naming its path; a host or an unknown parameter is a bad URL.
#[tokio::test]
async fn a_unix_socket_url_takes_the_database_user_and_password() {
    let acl = format!("{LOCKER_ACL} +select");
    let server = RedisServer::start_with_users(&[&acl]);
    let sock = server.socket();
    let url = |query: &str| format!("redis+unix://{}?{query}", sock.display());

    // Commands, renewals and pub/sub through the socket, as `locker`.
    let _held =
        renew_and_hand_over(&server, &url("user=locker&pass=s3cret&timeout=1s"), "unix").await;
    // The database and leasehold's own parameters beside the redis crate's.
    let l = locks(
        &url("db=2&user=locker&pass=s3cret&prefix=leasehold:u:lock:"),
        "d",
    )
    .await;
    let g = l
        .lock("unix")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let name = "leasehold:u:lock:unix";
    assert!(redis_cli(&server, 2, &["GET", name]).contains("\"holder\":\"d\""));
    assert_eq!(redis_cli(&server, 0, &["EXISTS", name]), "0");
    assert_eq!(
        redis_cli(&server, 2, &["GET", "leasehold:u:fence:unix"]),
        g.fence().to_string()
    );
    g.release().await.unwrap();
    assert_eq!(redis_cli(&server, 0, &["ACL", "LOG"]), "");
    let clients = redis_cli(&server, 0, &["CLIENT", "LIST"]);
    let lockers: Vec<&str> = clients
        .lines()
        .filter(|l| l.contains("user=locker"))
        .collect();
    assert!(
        lockers.iter().any(|l| l.contains("subscribe"))
            && lockers.iter().all(|l| l.contains(" addr=/")),
        "leasehold's connections (pub/sub among them) are not all on the socket: {clients}"
    );

    // A wrong password: not retryable, and neither it nor the right one shows.
    let err = leasehold::open_store(&url("user=locker&pass=wrong-pw&timeout=500ms"))
        .await
        .expect_err("wrong password");
    let text = err.to_string();
    assert!(!err.is_retryable(), "{text}");
    assert!(
        !text.contains("wrong-pw") && text.contains("pass=***"),
        "{text}"
    );

    // No socket there: retryable, naming the path.
    let gone = format!(
        "redis+unix://{}/none.sock?timeout=300ms",
        server.dir().display()
    );
    let err = leasehold::open_store(&gone).await.expect_err("no socket");
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("none.sock"), "{err}");

    // A host, an unknown parameter, a bad database number: bad URLs.
    for bad in [
        format!("redis+unix://somehost{}", sock.display()),
        url("colour=red"),
        url("db=two"),
    ] {
        let res = leasehold::open_store(&bad).await;
        assert!(
            matches!(res, Err(leasehold::Error::InvalidUrl { .. })),
            "{bad}: {res:?}"
        );
    }
}

/// A failover as Sentinel or a managed service does it, through a name that moves (here a TCP
/// proxy repointed to the promoted server, old connections left open as a DNS change leaves
/// them): the old primary, demoted to a replica, answers writes with `READONLY`. The store
/// takes that as a passing unavailability and connects again, reaching the new primary: a waiting
/// `acquire` gets its lease there, and a holder whose record had been replicated keeps renewing
/// it there.
#[tokio::test]
async fn a_failover_behind_a_moved_name_reaches_the_new_primary() {
    failover_behind_a_moved_name(false).await;
}

/// The same failover behind a moved name, but the old primary hangs (SIGSTOP: the connection to
/// it stays open and silent, as behind a partition that drops packets) instead of answering
/// `READONLY`: no error tells the connection to go, so the store connects again after a call runs
/// out of time, and reaches the promoted server through the moved name. Before, every call ran out
/// of time for as long as the old primary hung.
#[tokio::test]
async fn a_hung_primary_behind_a_moved_name_is_left_for_the_new_one() {
    failover_behind_a_moved_name(true).await;
}

/// A failover behind a TCP proxy: the replica promoted, the proxy repointed to it, and the old
/// primary following it as a replica — or, when it `hangs`, stopped with SIGSTOP. A contender
/// waits through it and gets its lease on the new primary; the holder keeps renewing there.
async fn failover_behind_a_moved_name(hangs: bool) {
    use leasehold_testkit::proxy::TcpProxy;
    let (old, new) = (RedisServer::start(), RedisServer::start());
    let port = |s: &RedisServer| s.port.to_string();
    assert!(new
        .command(&["REPLICAOF", "127.0.0.1", &port(&old)])
        .is_some_and(|r| r.starts_with("+OK")));
    new.synced_as_replica().await;
    let proxy = TcpProxy::start(old.port);
    // A hung server is noticed by a call running out of time: 500 ms, and the lease outlives it.
    let (timeout, ttl) = if hangs {
        ("500ms", Duration::from_secs(3))
    } else {
        ("1s", Duration::from_millis(1500))
    };
    let url = format!("redis://127.0.0.1:{}/0?timeout={timeout}", proxy.port);
    let l = locks(&url, "a").await;
    let held = l
        .lock("held")
        .unwrap()
        .ttl(ttl)
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    // The record and its counter reached the replica before the failover.
    old.replicated_to(&new).await;

    // The failover: the replica is promoted, the old primary follows it (or hangs), the name moves.
    if hangs {
        old.pause();
    }
    assert!(new
        .command(&["REPLICAOF", "NO", "ONE"])
        .is_some_and(|r| r.starts_with("+OK")));
    if !hangs {
        assert!(old
            .command(&["REPLICAOF", "127.0.0.1", &port(&new)])
            .is_some_and(|r| r.starts_with("+OK")));
        old.synced_as_replica().await;
    }
    proxy.point_to(new.port);

    // A contender waits through the failover and gets its lease on the new primary.
    let g = l
        .lock("after")
        .unwrap()
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("a lease after the failover");
    let on_new = new
        .command(&["GET", "leasehold:lock:after"])
        .unwrap_or_default();
    assert!(
        on_new.contains(&format!("\"fence\":{}", g.fence())),
        "{on_new}"
    );
    g.release().await.unwrap();
    // The holder renewed through it: past its TTL, still current, and its record on the new primary
    // runs on.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    renewed_on(held, &new).await;
    if hangs {
        old.resume();
    }
}

/// A waiter subscribed before a failover whose old primary hangs (its pub/sub connection stays
/// open and silent, hearing nothing the new primary publishes) subscribes again, on the new
/// primary: the store checks a pub/sub connection with subscriptions every second, and one that
/// does not answer within the timeout ends, waking its waiters. The waiter's timers are 30 s, so
/// only that wakes it in the test's time; before, it slept through the failover.
#[tokio::test]
async fn a_waiter_subscribed_before_a_hung_failover_hears_the_new_primary() {
    use leasehold_testkit::proxy::TcpProxy;
    let (old, new) = (RedisServer::start(), RedisServer::start());
    assert!(new
        .command(&["REPLICAOF", "127.0.0.1", &old.port.to_string()])
        .is_some_and(|r| r.starts_with("+OK")));
    new.synced_as_replica().await;
    let proxy = TcpProxy::start(old.port);
    let url = format!("redis://127.0.0.1:{}/0?timeout=500ms", proxy.port);
    let key = "deaf";
    let h = locks(&url, "h").await;
    let held = h
        .lock(key)
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let waiter = leasehold_testkit::spawn_deaf_waiter(locks(&url, "w").await, key);
    await_waiting(&old, key, "\"watched\":true").await;
    old.replicated_to(&new).await;

    // The failover: the old primary hangs, the replica is promoted, the name moves.
    old.pause();
    assert!(new
        .command(&["REPLICAOF", "NO", "ONE"])
        .is_some_and(|r| r.starts_with("+OK")));
    proxy.point_to(new.port);
    // An operator frees the key on the new primary (through a store opened after the failover).
    leasehold_testkit::force_release_through(&url, key).await;
    let g = leasehold_testkit::woken_after(waiter, Instant::now(), "the waiter").await;
    assert!(record(&new, key).contains("\"holder\":\"w\""));
    g.release().await.unwrap();
    drop(held);
    old.resume();
}

/// Checks that `held` (the lease of key `held`) is still current and its record lives on `server`
/// (the new primary after a failover), then releases it.
async fn renewed_on(held: LeaseGuard, server: &leasehold_servers::RedisServer) {
    if !held.is_current() {
        panic!(
            "the holder lost its lease in the failover: {}",
            held.lost().await
        );
    }
    let pttl = server
        .command(&["PTTL", "leasehold:lock:held"])
        .unwrap_or_default();
    let left: i64 = pttl.trim().trim_start_matches(':').parse().unwrap_or(-2);
    assert!(left > 0, "no live record on the new primary: {pttl}");
    assert_eq!(held.release().await.unwrap(), Released::Released);
}

/// A server that is out of memory (`maxmemory` with the `noeviction` policy the README asks for)
/// refuses writes with `OOM` until memory frees up. That is a passing condition, not a verdict:
/// a holder keeps its lease by renewing once memory is back (it does not call it lost at the first
/// refusal), a `try_acquire` is a retryable error, and a waiting `acquire` gets its lease when the
/// server accepts writes again.
#[tokio::test]
async fn a_server_out_of_memory_is_retried_not_fatal() {
    let server = RedisServer::start();
    let l = locks(&server.url(), "a").await;
    let g = l
        .lock("held")
        .unwrap()
        .ttl(Duration::from_millis(1500))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let set_maxmemory = |bytes: &str| {
        assert!(server
            .command(&["CONFIG", "SET", "maxmemory", bytes])
            .is_some_and(|r| r.starts_with("+OK")));
    };
    set_maxmemory("1");
    let err = l
        .lock("other")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("no writes while out of memory");
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("OOM"), "{err}");
    let waiter = spawn_waiter(l.clone(), "other", true);
    // A renewal (every 500 ms) meets the refusal in this second; memory comes back before expiry.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(g.is_current(), "the holder gave up at the first refusal");
    set_maxmemory("0");
    let w = waiter
        .await
        .unwrap()
        .0
        .expect("a lease once memory is back");
    // Past the TTL: the holder renewed once writes were accepted again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        g.is_current(),
        "the holder lost its lease to an out-of-memory spell"
    );
    assert_eq!(g.release().await.unwrap(), Released::Released);
    w.release().await.unwrap();
}

/// Waits (up to 20 s) until the sentinels name a primary other than `old`, and that server says it
/// is one; returns its port.
async fn await_new_primary(set: &leasehold_testkit::servers::SentinelSet, old: u16) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(port) = set.primary_port().filter(|p| *p != old) {
            let role = set
                .server(port)
                .and_then(|s| s.command(&["ROLE"]))
                .unwrap_or_default();
            if role.contains("master") {
                return port;
            }
        }
        assert!(Instant::now() < deadline, "no failover within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `redis+sentinel://`: a Sentinel failover (`SENTINEL FAILOVER`) moves the store to the
/// promoted primary as the sentinels announce it (`+switch-master`) — while the old primary,
/// which Sentinel demotes only at its next look, still takes writes — and a holder whose record was
/// replicated keeps renewing it there. The sentinels require a password (`?sentinel_pass=`).
#[tokio::test]
async fn a_sentinel_failover_moves_the_store_to_the_promoted_primary() {
    // Sentinels that require a password, as Helm charts deploy them.
    let _alone = SENTINELS_ALONE.lock().await;
    let set = leasehold_testkit::servers::SentinelSet::start_with_password(Some("sentpw"));
    let without = format!(
        "{}?timeout=500ms",
        set.url().replace("?sentinel_pass=sentpw", "")
    );
    let err = leasehold::open_store(&without)
        .await
        .expect_err("sentinels that require a password");
    assert!(
        !err.is_retryable() && err.to_string().contains("NOAUTH"),
        "{err}"
    );
    let shown = leasehold::redact_url(&set.url());
    assert!(!shown.contains("sentpw"), "{shown}");
    let old = set.primary_port().expect("a primary");
    let l = locks(&set.url_with("timeout=1s"), "a").await;
    let held = l
        .lock("held")
        .unwrap()
        .ttl(Duration::from_secs(2))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    // `l` waits once before the failover: its pub/sub connection is on the old primary.
    let b = locks(&set.url_with("timeout=1s"), "b").await;
    let pre = b.lock("pre").unwrap().try_acquire().await.unwrap().unwrap();
    let waited = l
        .lock("pre")
        .unwrap()
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(waited.is_err());
    pre.release().await.unwrap();
    let old_server = set.server(old).expect("the old primary");
    set.replicated_from(old).await;
    assert!(set.sentinels[0]
        .command(&[
            "SENTINEL",
            "FAILOVER",
            leasehold_testkit::servers::SENTINEL_MASTER
        ])
        .is_some_and(|r| r.starts_with("+OK")));
    let new = await_new_primary(&set, old).await;
    let new_server = set.server(new).expect("the new primary");

    grants_land_on(&l, new_server).await;
    // Its next wait subscribes on the new primary and is woken by the release's message.
    let g = b
        .lock("handoff")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let waiter = spawn_waiter(l.clone(), "handoff", true);
    await_waiting(new_server, "handoff", "\"waiter_token\":\"").await;
    release_wakes(g, waiter, "a waiter after the failover").await;
    // The store moved on the announcement, not on a READONLY: the old primary still says it is one.
    assert!(
        old_server
            .command(&["ROLE"])
            .is_some_and(|r| r.contains("master")),
        "the old primary was already demoted: this did not test the announcement"
    );
    // Past the holder's TTL: it renewed on the new primary.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    renewed_on(held, new_server).await;
}

/// Within a second of the sentinels' announcement, grants through `l` land on `new_server` (each
/// held and released at once; the record stays on the new primary only while held, so its
/// presence there is checked while held).
async fn grants_land_on(l: &Locks, new_server: &leasehold_servers::RedisServer) {
    let switched = Instant::now();
    for attempt in 0.. {
        let key = format!("after-{attempt}");
        let g = l.lock(&key).unwrap().try_acquire().await;
        let landed = new_server
            .command(&["EXISTS", &format!("leasehold:lock:{key}")])
            .is_some_and(|r| r.starts_with(":1"));
        if let Ok(Some(g)) = g {
            g.release().await.unwrap();
        }
        if landed {
            return;
        }
        assert!(
            switched.elapsed() < Duration::from_secs(1),
            "grants still missed the new primary 1 s after the switch"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A sentinel that stops answering (SIGSTOP: its connections stay open, as behind a partition)
/// does not hide a failover the others announce: the store follows every sentinel, and moves to
/// the promoted primary on their announcement, while the old primary still claims to be one.
#[tokio::test]
async fn a_silent_sentinel_does_not_hide_a_failover() {
    let _alone = SENTINELS_ALONE.lock().await;
    let set = leasehold_testkit::servers::SentinelSet::start();
    let old = set.primary_port().expect("a primary");
    let l = locks(&set.url_with("timeout=1s"), "a").await;
    let g = l
        .lock("before")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    let old_server = set.server(old).expect("the old primary");
    set.replicated_from(old).await;
    set.sentinels[0].pause();
    let master = leasehold_testkit::servers::SENTINEL_MASTER;
    assert!(set.sentinels[1]
        .command(&["SENTINEL", "FAILOVER", master])
        .is_some_and(|r| r.starts_with("+OK")));
    // The promoted primary, as the sentinel that ran the failover names it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let new = loop {
        let named = set.sentinels[1]
            .command(&["SENTINEL", "get-master-addr-by-name", master])
            .and_then(|r| r.lines().last()?.trim().parse::<u16>().ok())
            .filter(|p| *p != old);
        let promoted = named.filter(|p| {
            set.server(*p)
                .and_then(|s| s.command(&["ROLE"]))
                .is_some_and(|r| r.contains("master"))
        });
        if let Some(p) = promoted {
            break p;
        }
        assert!(Instant::now() < deadline, "no failover within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    grants_land_on(&l, set.server(new).expect("the new primary")).await;
    assert!(
        old_server
            .command(&["ROLE"])
            .is_some_and(|r| r.contains("master")),
        "the old primary was already demoted: this did not test the announcement"
    );
    set.sentinels[0].resume();
}

/// `redis+sentinel://`: the primary is killed; the sentinels promote the replica, and a contender
/// that was waiting through the outage gets its lease on the new primary.
#[tokio::test]
async fn a_killed_sentinel_primary_is_replaced_and_a_waiter_gets_its_lease() {
    let _alone = SENTINELS_ALONE.lock().await;
    primary_replaced(leasehold_testkit::servers::SentinelSet::start(), false).await;
}

/// `redis+sentinel://`: the primary hangs (SIGSTOP: its connections stay open and silent, as
/// behind a partition that drops packets); the sentinels promote the replica, and a contender
/// waiting through it gets its lease on the new primary.
#[tokio::test]
async fn a_hung_sentinel_primary_is_replaced_and_a_waiter_gets_its_lease() {
    let _alone = SENTINELS_ALONE.lock().await;
    primary_replaced(leasehold_testkit::servers::SentinelSet::start(), true).await;
}

/// `rediss+sentinel://…?ca=`: the same over TLS only (sentinels, data servers and replication),
/// trusting the test CA; without `?ca=` the system trust store refuses it for good.
#[tokio::test]
async fn a_tls_sentinel_deployment_is_followed_through_a_failover() {
    let _alone = SENTINELS_ALONE.lock().await;
    let set = leasehold_testkit::servers::SentinelSet::start_tls();
    let url = set.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let untrusted = format!("{}?timeout=500ms", &url[..url.find('?').unwrap()]);
    let err = leasehold::open_store(&untrusted)
        .await
        .expect_err("the test CA is not in the system trust store");
    assert!(!err.is_retryable(), "{err}");
    let plain = url.replacen("rediss+sentinel", "redis+sentinel", 1);
    assert!(matches!(
        leasehold::open_store(&plain).await,
        Err(leasehold::Error::InvalidUrl { .. })
    ));
    primary_replaced(set, false).await;
}

/// The primary of `set` is killed (or, when it `hangs`, stopped with SIGSTOP) while a contender
/// waits; the contender gets its lease from the promoted primary.
async fn primary_replaced(mut set: leasehold_testkit::servers::SentinelSet, hangs: bool) {
    let old = set.primary_port().expect("a primary");
    let l = locks(&set.url_with("timeout=500ms"), "a").await;
    let g = l
        .lock("before")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    let index = set.servers.iter().position(|s| s.port == old).expect("old");
    if hangs {
        set.servers[index].pause();
    } else {
        set.servers[index].stop();
    }
    let waiter = spawn_waiter_for(l.clone(), "after", true, Duration::from_secs(30));
    let new = await_new_primary(&set, old).await;
    let g = waiter
        .await
        .unwrap()
        .0
        .expect("a lease from the promoted primary");
    let record = set
        .server(new)
        .and_then(|s| s.command(&["GET", "leasehold:lock:after"]))
        .unwrap_or_default();
    assert!(
        record.contains(&format!("\"fence\":{}", g.fence())),
        "{record}"
    );
    g.release().await.unwrap();
    if hangs {
        set.servers[index].resume();
    }
}

/// `redis+sentinel://` URLs: a missing master name or a bad server is a bad URL; sentinels that do
/// not answer are a retryable error; a master name the sentinels do not know is an error that says
/// so; the data servers' password never shows.
#[tokio::test]
async fn sentinel_urls_are_checked() {
    for bad in [
        "redis+sentinel://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/",
        "redis+sentinel://127.0.0.1:1,nohost/m",
        "redis+sentinel://127.0.0.1:1/m?colour=red",
        "rediss+sentinel://127.0.0.1:1",
    ] {
        let res = leasehold::open_store(bad).await;
        assert!(
            matches!(res, Err(leasehold::Error::InvalidUrl { .. })),
            "{bad}: {res:?}"
        );
    }
    let missing_ca = "rediss+sentinel://127.0.0.1:1/m?ca=/nonexistent/ca.pem";
    assert!(matches!(
        leasehold::open_store(missing_ca).await,
        Err(leasehold::Error::Io { .. })
    ));
    let port = leasehold_testkit::servers::free_port();
    let err = leasehold::open_store(&format!(
        "redis+sentinel://u:hunter2@127.0.0.1:{port}/m?timeout=300ms"
    ))
    .await
    .expect_err("no sentinel listens");
    assert!(err.is_retryable(), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let set = leasehold_testkit::servers::shared_sentinels();
    let unknown = set.url().replace("/leasehold/", "/nosuchmaster/");
    let err = leasehold::open_store(&unknown)
        .await
        .expect_err("unknown master");
    assert!(err.to_string().to_lowercase().contains("master"), "{err}");
}

/// An operator (or another program) storing a hash where a record lives costs that one lease,
/// not the others renewed in the same batch (see [`leasehold_testkit::overwritten_with_a_hash`]).
#[tokio::test]
async fn a_record_overwritten_with_another_type_costs_only_its_own_lease() {
    let server = shared_redis();
    leasehold_testkit::overwritten_with_a_hash(&server.url(), "leasehold:lock:", |args| {
        server.command(args).unwrap();
    })
    .await;
}

/// `notify_release` (what `leasehold watch` asks): a lease nobody waits for gets the
/// `"watched":true` mark and nothing else changes (fence, times, the key's TTL), so its release
/// publishes to a subscriber; a fence other than the held one, or no lease, answers `false`.
#[tokio::test]
async fn a_release_asked_for_is_published_and_the_mark_changes_nothing_else() {
    let server = shared_redis();
    let l = locks(&server.url(), "a").await;
    let store = l.store().clone();
    let name = leasehold_testkit::prefix("notify");
    let key = leasehold::Key::new(&name).unwrap();
    assert!(
        !store.notify_release(&key, Some(1)).await.unwrap(),
        "no lease"
    );
    assert!(
        store.notify_release(&key, None).await.unwrap(),
        "nothing to do"
    );
    let g = l
        .lock(&name)
        .unwrap()
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    let before = record(server, &name);
    assert!(!before.contains("\"watched\":true"), "{before}");
    let fence = g.fence();
    assert!(!store.notify_release(&key, Some(fence + 1)).await.unwrap());
    assert_eq!(
        record(server, &name),
        before,
        "a wrong fence changed the record"
    );
    let mut changes = store.subscribe(&key).await.unwrap().unwrap();
    assert!(store.notify_release(&key, Some(fence)).await.unwrap());
    let after = record(server, &name);
    // The text after RESP's length line: the mark adds itself, nothing else changes.
    let text = |raw: &str| raw.split_once("\r\n").map(|(_, t)| t.to_owned()).unwrap();
    assert_eq!(
        text(&after).replace(",\"watched\":true", ""),
        text(&before),
        "the mark changed more than itself"
    );
    let ttl: i64 = server
        .command(&["PTTL", &format!("leasehold:lock:{name}")])
        .and_then(|r| r.trim_start_matches(':').trim().parse().ok())
        .unwrap();
    assert!(
        (20_000..=30_000).contains(&ttl),
        "the key's TTL is now {ttl} ms"
    );
    // Asked again (a watcher looking twice): still true, still one mark.
    assert!(store.notify_release(&key, Some(fence)).await.unwrap());
    assert_eq!(record(server, &name), after);
    g.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("the release was not published");
}

/// The lease on `key` through `l`, which is free.
async fn take_free(l: &Locks, key: &str) -> LeaseGuard {
    l.lock(key).unwrap().try_acquire().await.unwrap().unwrap()
}

/// A primary with a replica that has synced with it.
async fn primary_and_replica() -> (RedisServer, RedisServer) {
    replicated(RedisServer::start()).await
}

/// `primary` with a replica that has synced with it.
async fn replicated(primary: RedisServer) -> (RedisServer, RedisServer) {
    let replica = RedisServer::start();
    assert!(replica
        .command(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()])
        .is_some_and(|r| r.starts_with("+OK")));
    replica.synced_as_replica().await;
    (primary, replica)
}

/// `?replicas=1`: a grant is answered only once the replica has it (Redis's `WAIT`, in the same
/// round trip); while the replica does not answer (SIGSTOP), an acquisition fails retryably
/// after `replicas_timeout`, naming the replicas, and leaves the key free — a grant a failover
/// could lose is not handed out. A store that asks for no replicas is granted the same key
/// meanwhile. Scripts the server forgot are loaded again on this path too.
#[tokio::test]
async fn a_grant_the_replica_does_not_acknowledge_is_not_handed_out() {
    let (primary, replica) = primary_and_replica().await;
    let url = format!("{}?replicas=1&replicas_timeout=200ms", primary.url());
    let l = locks(&url, "a").await;
    let record = "leasehold:lock:job";
    let g = take_free(&l, "job").await;
    // Answered once the replica has it: no waiting for replication here.
    assert!(replica
        .command(&["GET", record])
        .is_some_and(|r| r.contains("\"holder\":\"a\"")));
    g.release().await.unwrap();

    replica.pause();
    let started = Instant::now();
    let e = l.lock("job").unwrap().try_acquire().await.unwrap_err();
    let took = started.elapsed();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("replicas"), "{e}");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(1),
        "{took:?}"
    );
    assert!(
        primary
            .command(&["GET", record])
            .is_some_and(|r| r.starts_with("$-1")),
        "the unacknowledged grant was kept: {:?}",
        primary.command(&["GET", record])
    );
    // Without replicas asked for, the same key is granted at once.
    let plain = locks(&primary.url(), "b").await;
    let pg = take_free(&plain, "job").await;
    pg.release().await.unwrap();

    replica.resume();
    replica.synced_as_replica().await;
    assert!(primary
        .command(&["SCRIPT", "FLUSH"])
        .is_some_and(|r| r.starts_with("+OK")));
    let g = take_free(&l, "job").await;
    assert!(replica
        .command(&["GET", record])
        .is_some_and(|r| r.contains("\"holder\":\"a\"")));
    g.release().await.unwrap();
}

/// `?replicas=1`: renewals the replica does not acknowledge fail, so a holder whose replica stops
/// answering learns that its lease is at risk: `lost()` fires before its TTL runs out, as for a
/// server that stops answering.
#[tokio::test]
async fn renewals_the_replica_does_not_acknowledge_lose_the_lease() {
    let (primary, replica) = primary_and_replica().await;
    let url = format!("{}?replicas=1&replicas_timeout=100ms", primary.url());
    let l = locks(&url, "a").await;
    let g = lost_before_the_ttl(&l, || replica.pause()).await;
    assert!(!g.is_current());
    replica.resume();
}

/// `?replicas=1`: the calls that wait for replicas have a connection of their own (`WAIT` holds
/// the connection it is sent on until the replicas answer). While the replica does not answer
/// (SIGSTOP) and an acquisition waits out `replicas_timeout` in `WAIT`, a lease granted before is
/// inspected, listed and released at once, not behind it; the acquisition still fails as it
/// should, and leaves nothing held.
#[tokio::test]
async fn a_replica_that_does_not_answer_holds_up_no_release() {
    let (primary, replica) = primary_and_replica().await;
    let url = format!(
        "{}?replicas=1&replicas_timeout=1500ms&timeout=3s",
        primary.url()
    );
    let l = locks(&url, "a").await;
    let held = take_free(&l, "held").await;
    replica.pause();
    let waiting = {
        let l = l.clone();
        tokio::spawn(async move { l.lock("other").unwrap().try_acquire().await.map(|_| ()) })
    };
    primary.a_client_blocked().await;
    let seen = answered_at_once("an inspection", l.store().inspect(held.key())).await;
    assert!(seen.unwrap().is_some(), "the held record was not found");
    // The held lease, and the grant whose `WAIT` is pending.
    let listed = answered_at_once("a listing", l.store().list("")).await;
    assert_eq!(listed.unwrap().len(), 2);
    let released = answered_at_once("a release", held.release()).await;
    assert_eq!(released.unwrap(), Released::Released);
    let e = waiting.await.unwrap().unwrap_err();
    leasehold_testkit::assert_not_replicated(&e, "an acquisition");
    for record in ["leasehold:lock:held", "leasehold:lock:other"] {
        assert!(
            primary
                .command(&["GET", record])
                .is_some_and(|r| r.starts_with("$-1")),
            "{record} left held: {:?}",
            primary.command(&["GET", record])
        );
    }
    replica.resume();
}

/// The error opening a store at `url` gives.
async fn refused(url: &str) -> leasehold::Error {
    leasehold::open_store(url).await.map(|_| ()).unwrap_err()
}

/// `replicas` and `replicas_timeout` are checked: a number, a wait of at least 1 ms and less than
/// the timeout, the wait only with replicas, on a cluster too, and never on Redlock.
#[tokio::test]
async fn replica_options_are_checked() {
    let server = shared_redis();
    for (query, says) in [
        ("replicas=two", "whole number"),
        ("replicas=-1", "whole number"),
        ("replicas=1&replicas_timeout=0ms", "at least 1ms"),
        ("replicas=1&replicas_timeout=2s", "less than the timeout"),
        (
            "replicas=1&timeout=100ms&replicas_timeout=100ms",
            "less than the timeout",
        ),
        ("replicas_timeout=100ms", "give replicas=N too"),
        ("replicas=1&replicas_timeout=soon", "replicas_timeout"),
    ] {
        let e = refused(&format!("{}?{query}", server.url())).await;
        assert!(
            matches!(e, leasehold::Error::InvalidUrl { .. }) && e.to_string().contains(says),
            "{query}: {e}"
        );
    }
    let nodes = &leasehold_testkit::servers::shared_redis_nodes()[..3];
    let redlock = format!(
        "{}?replicas=1",
        leasehold_testkit::servers::redlock_url(nodes)
    );
    let e = refused(&redlock).await;
    assert!(
        matches!(e, leasehold::Error::InvalidOption { .. }) && e.to_string().contains("Redlock"),
        "{redlock}: {e}"
    );
    let e = refused("redis+cluster://127.0.0.1:1?replicas=1&replicas_timeout=0ms").await;
    assert!(
        matches!(e, leasehold::Error::InvalidUrl { .. }) && e.to_string().contains("at least 1ms"),
        "{e}"
    );
    // Accepted: the default wait (half the timeout), and one given.
    for query in [
        "replicas=0",
        "replicas=1",
        "replicas=2&replicas_timeout=50ms",
    ] {
        leasehold::open_store(&format!("{}?{query}", server.url()))
            .await
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{query}: {e}"));
    }
}

/// `?replicas=1` with many acquisitions at once: they share script calls (coalesced while the
/// server is busy), each batch followed by its `WAIT`, and each grant is on the replica when it
/// is answered; while the replica does not answer, every one of them fails and none is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_made_at_once_are_each_on_the_replica_when_answered() {
    let (primary, replica) = primary_and_replica().await;
    let l = locks(
        // A `WAIT` holds the connection until it is answered: with the replica stopped, the
        // call sent alone waits 300 ms, then the batch behind it; the timeout leaves them room.
        &format!(
            "{}?replicas=1&replicas_timeout=300ms&timeout=5s",
            primary.url()
        ),
        "a",
    )
    .await;
    let before = primary.script_calls();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (l, record) = (l.clone(), format!("leasehold:lock:many/{i}"));
            let replica_port = replica.port;
            tokio::spawn(async move {
                let g = l
                    .lock(format!("many/{i}"))
                    .unwrap()
                    .try_acquire()
                    .await
                    .unwrap()
                    .unwrap();
                let there = leasehold_testkit::servers::command_on(replica_port, &["GET", &record])
                    .is_some_and(|r| r.contains("\"holder\":\"a\""));
                (g, there)
            })
        })
        .collect();
    let mut guards = vec![];
    for t in tasks {
        let (g, there) = t.await.unwrap();
        assert!(there, "{} was answered before the replica had it", g.key());
        guards.push(g);
    }
    let calls = primary.script_calls() - before;
    assert!(
        calls < 64,
        "{calls} script calls for 64 grants: none shared"
    );
    for g in guards {
        g.release().await.unwrap();
    }

    replica.pause();
    let before = primary.script_calls();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let l = l.clone();
            tokio::spawn(async move { l.lock(format!("many/{i}")).unwrap().try_acquire().await })
        })
        .collect();
    for t in tasks {
        let e = t.await.unwrap().map(|_| ()).unwrap_err();
        leasehold_testkit::assert_not_replicated(&e, "an acquisition");
    }
    let calls = primary.script_calls() - before;
    assert!(
        calls < 128,
        "{calls} script calls for 64 attempts and releases: none shared"
    );
    for i in 0..64 {
        let record = format!("leasehold:lock:many/{i}");
        assert!(
            primary
                .command(&["GET", &record])
                .is_some_and(|r| r.starts_with("$-1")),
            "{record} is held"
        );
    }
    replica.resume();
}

/// A server that refuses writes for want of replicas (`min-replicas-to-write`, answered
/// `NOREPLICAS`) is a passing condition: the acquisition fails retryably, and succeeds once the
/// server accepts writes again.
#[tokio::test]
async fn a_server_short_of_replicas_is_retried_not_fatal() {
    let server = RedisServer::start();
    let l = locks(&server.url(), "a").await;
    assert!(server
        .command(&["CONFIG", "SET", "min-replicas-to-write", "1"])
        .is_some_and(|r| r.starts_with("+OK")));
    let e = l.lock("job").unwrap().try_acquire().await.unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("NOREPLICAS"),
        "{e}"
    );
    assert!(server
        .command(&["CONFIG", "SET", "min-replicas-to-write", "0"])
        .is_some_and(|r| r.starts_with("+OK")));
    let g = take_free(&l, "job").await;
    g.release().await.unwrap();
}

/// `?replicas=` needs `+wait` besides the least ACL: with it, grants go through; without it, an
/// acquisition fails with a clear, non-retryable permission error, and the grant the script made
/// before `WAIT` was refused is not left held.
#[tokio::test]
async fn replicas_need_the_wait_command() {
    let acl = format!("{} +wait", LOCKER_ACL.replacen("locker", "waiter", 1));
    let (primary, _replica) = replicated(RedisServer::start_with_users(&[LOCKER_ACL, &acl])).await;
    let url = |user: &str| {
        format!(
            "redis://{user}:s3cret@127.0.0.1:{}/0?replicas=1",
            primary.port
        )
    };
    let e = locks(&url("locker"), "a")
        .await
        .lock("job")
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        !e.is_retryable() && e.to_string().to_lowercase().contains("wait"),
        "{e}"
    );
    assert!(
        primary
            .command(&["GET", "leasehold:lock:job"])
            .is_some_and(|r| r.starts_with("$-1")),
        "the grant was left held"
    );
    let g = take_free(&locks(&url("waiter"), "b").await, "job").await;
    g.release().await.unwrap();
}

/// `?replicas=1` behind Sentinel: a grant made while the replica lags (stopped for 500 ms) is
/// answered only once the replica has it, so when the primary is killed right after, the
/// promoted replica still holds the lease and a contender is refused. Without `?replicas=` the
/// grant is answered at once, the killed primary takes it along, and the contender would get the
/// same key: two holders.
#[tokio::test]
async fn an_acknowledged_grant_survives_a_killed_primary() {
    let _alone = SENTINELS_ALONE.lock().await;
    let mut set = leasehold_testkit::servers::SentinelSet::start();
    let old = set.primary_port().expect("a primary");
    let l = locks(
        &set.url_with("replicas=1&replicas_timeout=3s&timeout=5s"),
        "a",
    )
    .await;
    take_free(&l, "warm").await.release().await.unwrap();
    let index = set.servers.iter().position(|s| s.port == old).expect("old");
    let replica = &set.servers[1 - index];
    replica.pause();
    let pid = replica.pid().expect("the replica runs");
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        std::process::Command::new("kill")
            .args(["-CONT", &pid.to_string()])
            .status()
    });
    let g = leasehold_testkit::take(&l, "kept", Duration::from_secs(30)).await;
    set.servers[index].stop();
    assert!(resume.join().unwrap().unwrap().success());
    let new = await_new_primary(&set, old).await;
    let record = set
        .server(new)
        .and_then(|s| s.command(&["GET", "leasehold:lock:kept"]))
        .unwrap_or_default();
    assert!(
        record.contains("\"holder\":\"a\""),
        "the grant was lost: {record}"
    );
    let b = locks(&set.url_with("timeout=1s"), "b").await;
    assert!(
        b.lock("kept")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a second holder"
    );
    drop(g);
}
