//! Redis Cluster behaviour against a real cluster (three primaries, a replica of each): the records
//! as operators find them, listing across primaries, 10,000 leases renewed per primary, a graceful
//! failover and a killed primary, and the URLs and keys the store refuses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{Error, LeaseGuard, Locks, LostReason, Released};
use leasehold_servers::RedisServer;
use leasehold_testkit::answered_at_once;
use leasehold_testkit::servers::{shared_redis_cluster, Pausable, RedisCluster};
use std::time::{Duration, Instant};

/// Held by each test that starts a cluster of its own (six servers): they run one at a time, so
/// that their timings (renewals every 500 ms, failovers) do not depend on how many others share
/// the machine's cores at once.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn locks(url: &str, holder: &str) -> Locks {
    leasehold_testkit::connect_as(url, holder).await
}

async fn take(l: &Locks, key: &str, ttl: Duration) -> LeaseGuard {
    leasehold_testkit::take(l, key, ttl).await
}

/// The record of `key` as the store names it on a cluster (`leasehold:lock:{KEY}`: the key is
/// the hash tag, so the record and its fence counter share a slot).
fn record_name(key: &str) -> String {
    format!("leasehold:lock:{{{key}}}")
}

/// A key (`{stem}-N`) whose record `leasehold:lock:{…}` the primary on `port` serves.
fn key_served_by(cluster: &RedisCluster, port: u16, stem: &str) -> String {
    keys_served_by(cluster, port, stem, 1)
        .pop()
        .expect("a key on that primary")
}

/// `n` keys (`{stem}-N`) whose records the primary on `port` serves (among the first thousand).
fn keys_served_by(cluster: &RedisCluster, port: u16, stem: &str, n: usize) -> Vec<String> {
    (0..1000)
        .map(|i| format!("{stem}-{i}"))
        .filter(|k| {
            cluster
                .primary_for(&record_name(k))
                .is_some_and(|n| n.port == port)
        })
        .take(n)
        .collect()
}

/// Tries to take each of `keys` through `l`, all at once (a task each); the answers in order.
async fn try_all_at_once(l: &Locks, keys: &[String]) -> Vec<leasehold::Result<Option<LeaseGuard>>> {
    let tasks: Vec<_> = keys
        .iter()
        .map(|k| {
            let (l, k) = (l.clone(), k.clone());
            tokio::spawn(async move { l.lock(&k).unwrap().try_acquire().await })
        })
        .collect();
    let mut answers = vec![];
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// Takes each of `keys` through `l`, all at once (a task each).
async fn take_all_at_once(l: &Locks, keys: &[String]) -> Vec<LeaseGuard> {
    let answers = try_all_at_once(l, keys).await;
    answers
        .into_iter()
        .zip(keys)
        .map(|(g, k)| g.unwrap().unwrap_or_else(|| panic!("{k} not granted")))
        .collect()
}

/// Waits until `cond` holds, for at most `limit`.
async fn await_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Operators find a key's record and fence counter, in one slot, on the primary serving it
/// (`redis-cli -c GET 'agent:lock:{KEY}'`); listing gathers the records of every primary; an
/// operator's `DEL` fires the holder's `lost()` at its next renewal.
#[tokio::test]
async fn operators_find_the_record_and_counter_on_the_serving_primary() {
    let cluster = shared_redis_cluster();
    let url = format!("{}?prefix=agent:lock:", cluster.url());
    let l = locks(&url, "ops").await;
    let key = leasehold_testkit::prefix("job");
    let g = take(&l, &key, Duration::from_millis(900)).await;
    let (name, counter) = (
        format!("agent:lock:{{{key}}}"),
        format!("agent:fence:{{{key}}}"),
    );
    let node = cluster
        .primary_for(&name)
        .expect("a primary serves the key");
    let record = node.command(&["GET", &name]).unwrap_or_default();
    assert!(record.contains("\"holder\":\"ops\""), "{record}");
    assert!(
        record.contains(&format!("\"fence\":{}", g.fence())),
        "{record}"
    );
    let fence = node.command(&["GET", &counter]).unwrap_or_default();
    assert!(fence.contains(&g.fence().to_string()), "{fence}");
    assert!(node
        .command(&["PTTL", &name])
        .is_some_and(|t| t.starts_with(':') && !t.starts_with(":-")));

    // Listing: records on several primaries, all found.
    let mut many = vec![];
    for i in 0..20 {
        many.push(take(&l, &format!("{key}/many/{i}"), Duration::from_secs(5)).await);
    }
    let listed = l.store().list(&format!("{key}/many/")).await.unwrap();
    assert_eq!(listed.len(), 20, "{listed:?}");
    let ports: std::collections::BTreeSet<u16> = (0..20)
        .filter_map(|i| cluster.primary_for(&format!("agent:lock:{{{key}/many/{i}}}")))
        .map(|n| n.port)
        .collect();
    assert!(ports.len() >= 2, "20 keys on one primary: {ports:?}");
    for g in many {
        g.release().await.unwrap();
    }

    assert!(node.command(&["DEL", &name]).unwrap().starts_with(":1"));
    let reason = tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost fires");
    assert_eq!(reason, LostReason::Released);
}

/// A waiter subscribes on the primary serving its key's slot, where the release publishes (the
/// cluster's bus forwards messages to other nodes only with delays of up to ≈ 40 ms), and is woken
/// within 100 ms of the release — on each of the three primaries.
#[tokio::test]
async fn waiters_subscribe_on_the_primary_serving_the_key() {
    let cluster = shared_redis_cluster();
    let a = locks(&cluster.url(), "a").await;
    let b = locks(&cluster.url(), "b").await;
    let stem = leasehold_testkit::prefix("sub");
    for node in &cluster.nodes[..3] {
        let key = key_served_by(cluster, node.port, &stem);
        let name = record_name(&key);
        let g = take(&a, &key, Duration::from_secs(5)).await;
        let waiter = spawn_waiter(b.clone(), &key, Duration::from_secs(10));
        let subscribed = || {
            node.command(&["PUBSUB", "NUMSUB", &name])
                .is_some_and(|r| r.trim_end().ends_with(":1"))
        };
        await_until(
            Duration::from_secs(5),
            "subscribed on the serving primary",
            || subscribed() && record(cluster, &name).contains("\"waiter\":\"b\""),
        )
        .await;
        let released = Instant::now();
        g.release().await.unwrap();
        let (got, at) = waiter.await.unwrap();
        got.expect("the waiter's lease").release().await.unwrap();
        let latency = at.duration_since(released);
        assert!(latency < Duration::from_millis(100), "{latency:?}");
    }
}

/// 10,000 leases held by one process all stay alive on a cluster, renewed by one script call per
/// primary per batch (naming no keys), not one per slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_stay_alive_on_a_cluster() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let l = locks(&cluster.url(), "many").await;
    let ttl = Duration::from_millis(2000);
    let guards = leasehold_testkit::take_many(&l, "many", 10_000, ttl).await;
    let before = cluster
        .nodes
        .iter()
        .map(RedisServer::script_calls)
        .sum::<u64>();
    tokio::time::sleep(Duration::from_millis(3000)).await; // 1.5 TTLs, 4.5 renewal periods
    let calls = cluster
        .nodes
        .iter()
        .map(RedisServer::script_calls)
        .sum::<u64>()
        - before;
    let current = guards.iter().filter(|g| g.is_current()).count();
    eprintln!("{calls} script calls renewed 10,000 leases on 3 primaries for 3 s");
    assert_eq!(current, 10_000, "leases lost while renewing");
    // By slot, 4.5 renewal periods would be ~40,000 calls (10,000 leases spread over ~6,000
    // slots); by primary, 10 batches of 1,000 to each of 3 primaries per period.
    assert!(
        calls < 2_000,
        "{calls} script calls: not batched per primary"
    );
    let started = Instant::now();
    let released = l.release_all().await.unwrap();
    let lapsed = guards.iter().filter(|g| !g.is_current()).count();
    eprintln!(
        "release_all: {released} released in {:?}, {lapsed} not current",
        started.elapsed()
    );
    assert!(released > 9_000, "release_all released only {released}");
    assert!(
        l.store().list("many/").await.unwrap().is_empty(),
        "leases left held after release_all"
    );
}

/// The record of `name` on the primary serving it now.
fn record(cluster: &RedisCluster, name: &str) -> String {
    cluster
        .primary_for(name)
        .and_then(|n| n.command(&["GET", name]))
        .unwrap_or_default()
}

/// A contender waiting for `key` through `l` (registered as waiter), up to `wait`.
type Waiter = tokio::task::JoinHandle<(leasehold::Result<LeaseGuard>, Instant)>;

fn spawn_waiter(l: Locks, key: &str, wait: Duration) -> Waiter {
    let key = key.to_owned();
    tokio::spawn(async move {
        let g = l.lock(&key).unwrap().wait(wait).acquire().await;
        (g, Instant::now())
    })
}

/// Waits until the primary on `port` serves the Redis key `name`.
async fn await_served_by(
    cluster: &RedisCluster,
    name: &str,
    port: u16,
    limit: Duration,
    what: &str,
) {
    await_until(limit, what, || {
        cluster.primary_for(name).is_some_and(|n| n.port == port)
    })
    .await;
}

/// Waits (up to 3 s) until holder `a` has rewritten the record `name` on the primary serving it
/// now: a renewal there.
async fn await_renewal_by_a(cluster: &RedisCluster, name: &str, what: &str) {
    let before = record(cluster, name);
    await_until(Duration::from_secs(3), what, || {
        let now = record(cluster, name);
        now.contains("\"holder\":\"a\"") && now != before
    })
    .await;
}

/// A replica of the primary on `port` that has received everything the primary had written when
/// this was called (the latest record included).
async fn synced_replica(cluster: &RedisCluster, port: u16) -> &RedisServer {
    let primary = cluster
        .nodes
        .iter()
        .find(|n| n.port == port)
        .expect("primary");
    let written = primary
        .replication_offset("master_repl_offset")
        .expect("offset");
    let mut found = None;
    await_until(Duration::from_secs(10), "a synced replica", || {
        found = cluster.replicas_of(port).into_iter().find(|r| {
            r.replica_synced()
                && r.replication_offset("slave_repl_offset")
                    .is_some_and(|o| o >= written)
        });
        found.is_some()
    })
    .await;
    found.expect("replica")
}

/// A graceful failover (`CLUSTER FAILOVER` on the replica): the cluster moves the slot, and the
/// store follows without a lost lease — the holder keeps renewing on the promoted primary, a
/// contender sees the lease held there, and a waiter is woken by the release within 100 ms.
#[tokio::test]
async fn a_graceful_failover_keeps_the_lease_and_wakes_the_waiter() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let port = cluster.nodes[1].port;
    let key = key_served_by(&cluster, port, "moved");
    let name = record_name(&key);
    let a = locks(&format!("{}?timeout=1s", cluster.url()), "a").await;
    let b = locks(&format!("{}?timeout=1s", cluster.url()), "b").await;
    let g = take(&a, &key, Duration::from_millis(1500)).await;
    let replica = synced_replica(&cluster, port).await;
    let promoted = replica.port;
    assert!(replica
        .command(&["CLUSTER", "FAILOVER"])
        .is_some_and(|r| r.starts_with("+OK")));
    await_served_by(
        &cluster,
        &name,
        promoted,
        Duration::from_secs(10),
        "the replica promoted",
    )
    .await;
    // Past the TTL the holder still holds it: it renewed on the promoted primary.
    await_renewal_by_a(&cluster, &name, "a renewal on the promoted primary").await;
    assert!(g.is_current(), "the lease was lost in a graceful failover");
    let held = b.lock(&key).unwrap().try_acquire().await.unwrap();
    assert!(held.is_none(), "granted twice after the failover");
    let waiter = spawn_waiter(b.clone(), &key, Duration::from_secs(10));
    await_until(Duration::from_secs(5), "the waiter registered", || {
        record(&cluster, &name).contains("\"waiter\":\"b\"")
    })
    .await;
    let released = Instant::now();
    let fence = g.fence();
    g.release().await.unwrap();
    let (got, at) = waiter.await.unwrap();
    let got = got.expect("the waiter's lease");
    let latency = at.duration_since(released);
    assert!(
        latency < Duration::from_millis(100),
        "the waiter took {latency:?} after the release (a timer, not pub/sub)"
    );
    assert!(got.fence() > fence);
    got.release().await.unwrap();
}

/// The second line of a raw RESP bulk-string or integer reply (`$40\r\nID\r\n`, `:2906\r\n`).
fn reply_value(reply: Option<String>) -> String {
    let reply = reply.unwrap_or_default();
    let mut lines = reply.lines();
    match lines.next() {
        Some(l) if l.starts_with(':') => l[1..].to_owned(),
        _ => lines.next().unwrap_or_default().to_owned(),
    }
}

/// Resharding: the slot of a held key moves to another primary (`CLUSTER SETSLOT … IMPORTING` /
/// `MIGRATING`, `MIGRATE` of the record and its counter, `SETSLOT … NODE`) while its holder keeps
/// renewing. The store follows the cluster's `ASK` (a renewal mid-migration runs on the target)
/// and `MOVED` answers: the holder keeps its lease on the new primary, a contender is refused
/// there, and the next holder's fence continues from the counter that moved with the record.
#[tokio::test]
async fn a_resharded_slot_keeps_its_leases_and_fences() {
    resharded("").await;
}

/// The same with `?replicas=1`: the renewal through `ASK` goes with its `WAIT` to the target
/// (asked there by the cluster connection) and is acknowledged by the target's replica.
#[tokio::test]
async fn a_resharded_slot_keeps_its_leases_with_replicas() {
    resharded("&replicas=1&replicas_timeout=300ms").await;
}

/// A key's slot moved by hand from one primary to another while `a` holds the key, through stores
/// made with `params` (`&…`) besides a timeout.
async fn resharded(params: &str) {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let (source, target) = (&cluster.nodes[0], &cluster.nodes[1]);
    let key = key_served_by(&cluster, source.port, "resharded");
    let (name, counter) = (record_name(&key), format!("leasehold:fence:{{{key}}}"));
    let slot = reply_value(source.command(&["CLUSTER", "KEYSLOT", &name]));
    let source_id = reply_value(source.command(&["CLUSTER", "MYID"]));
    let target_id = reply_value(target.command(&["CLUSTER", "MYID"]));
    let a = locks(&format!("{}?timeout=1s{params}", cluster.url()), "a").await;
    let b = locks(&format!("{}?timeout=1s{params}", cluster.url()), "b").await;
    let g = take(&a, &key, Duration::from_millis(1500)).await;
    let ok = |node: &RedisServer, args: &[&str]| {
        let reply = node.command(args).unwrap_or_default();
        assert!(reply.starts_with("+OK"), "{args:?}: {reply}");
    };
    ok(
        target,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id],
    );
    ok(
        source,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id],
    );
    let port = target.port.to_string();
    let calls = target.script_calls();
    ok(
        source,
        &[
            "MIGRATE",
            "127.0.0.1",
            &port,
            "",
            "0",
            "5000",
            "KEYS",
            &name,
            &counter,
        ],
    );
    // Mid-migration the source answers `ASK` for the moved keys: a renewal runs on the target.
    await_until(Duration::from_secs(3), "a renewal through ASK", || {
        target.script_calls() > calls
    })
    .await;
    assert!(g.is_current(), "the lease was lost mid-migration");
    for node in [target, source, &cluster.nodes[2]] {
        ok(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
    }
    await_served_by(
        &cluster,
        &name,
        target.port,
        Duration::from_secs(10),
        "the slot on the target",
    )
    .await;
    // Past the TTL: renewed on the new primary.
    await_renewal_by_a(&cluster, &name, "a renewal on the new primary").await;
    assert!(g.is_current(), "the lease was lost in the resharding");
    assert!(b.lock(&key).unwrap().try_acquire().await.unwrap().is_none());
    let fence = g.fence();
    g.release().await.unwrap();
    let next = take(&b, &key, Duration::from_secs(5)).await;
    assert_eq!(
        next.fence(),
        fence + 1,
        "the counter did not move with the record"
    );
    next.release().await.unwrap();
}

/// A killed primary (the first seed, which the store also used for pub/sub): the cluster promotes
/// its replica, and a contender that waited through the outage gets its lease there; a lease held
/// on another primary is kept throughout.
#[tokio::test]
async fn a_killed_primary_is_replaced_and_a_waiter_gets_its_lease() {
    let _alone = ALONE.lock().await;
    let mut cluster = RedisCluster::start();
    let port = cluster.nodes[0].port;
    let key = key_served_by(&cluster, port, "killed");
    let name = record_name(&key);
    let other = key_served_by(&cluster, cluster.nodes[1].port, "kept");
    let a = locks(&format!("{}?timeout=500ms", cluster.url()), "a").await;
    let b = locks(&format!("{}?timeout=500ms", cluster.url()), "b").await;
    // Leases that outlive the failover (the 2 s node timeout, then the election) with room.
    let kept = take(&a, &other, Duration::from_secs(15)).await;
    let g = take(&a, &key, Duration::from_secs(15)).await;
    let replica = synced_replica(&cluster, port).await.port;
    // b waits (subscribed through the first seed) while its primary dies.
    let waiter = spawn_waiter(b.clone(), &key, Duration::from_secs(30));
    await_until(Duration::from_secs(5), "the waiter registered", || {
        record(&cluster, &name).contains("\"waiter\":\"b\"")
    })
    .await;
    cluster.node_mut(port).expect("node").stop();
    await_served_by(
        &cluster,
        &name,
        replica,
        Duration::from_secs(20),
        "the replica promoted",
    )
    .await;
    // The holder's record reached the replica: the lease is still a's until it lets go.
    assert!(record(&cluster, &name).contains("\"holder\":\"a\""));
    let fence = g.fence();
    g.release().await.unwrap();
    let got = waiter
        .await
        .unwrap()
        .0
        .expect("a lease from the promoted primary");
    assert!(got.fence() > fence);
    assert!(record(&cluster, &name).contains("\"holder\":\"b\""));
    assert!(kept.is_current(), "a lease on another primary was lost");
    got.release().await.unwrap();
    kept.release().await.unwrap();
}

/// `rediss+cluster://`: a cluster whose nodes speak only TLS (to clients and to each other) is
/// reached with the CA from `?ca=`, every node checked against it; the system trust store, which
/// does not know the test CA, is a clear non-retryable error.
#[tokio::test]
async fn a_tls_cluster_is_reached_with_its_ca() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start_tls();
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let l = locks(&url, "tls").await;
    // Keys on every primary, a waiter woken through pub/sub over TLS.
    for i in 0..12 {
        let g = take(&l, &format!("tls/{i}"), Duration::from_secs(5)).await;
        g.release().await.unwrap();
    }
    let g = take(&l, "tls/handoff", Duration::from_secs(5)).await;
    let b = locks(&url, "b").await;
    let waiter = spawn_waiter(b, "tls/handoff", Duration::from_secs(10));
    let name = "leasehold:lock:{tls/handoff}";
    await_until(Duration::from_secs(5), "the waiter registered", || {
        cluster
            .nodes
            .iter()
            .filter_map(|n| n.command(&["GET", name]))
            .any(|r| r.contains("\"waiter\":\"b\""))
    })
    .await;
    g.release().await.unwrap();
    waiter
        .await
        .unwrap()
        .0
        .expect("the waiter's lease")
        .release()
        .await
        .unwrap();
    let plain = url.split('?').next().expect("url").to_owned() + "?timeout=1s";
    match leasehold::open_store(&plain).await {
        Err(e) => assert!(!e.is_retryable(), "{e}"),
        Ok(_) => panic!("the system trust store accepted the test CA"),
    }
}

/// An ACL user on every node (ACLs are per node) with the README's line plus `+cluster|slots`:
/// leases, listing and pub/sub work as that user, with the password hidden; a wrong password is a
/// non-retryable error.
#[tokio::test]
async fn acl_users_work_on_a_cluster() {
    let cluster = shared_redis_cluster();
    let url = locker_on_every_node(cluster);
    let a = locks(&url, "a").await;
    let b = locks(&url, "b").await;
    let key = leasehold_testkit::prefix("acl");
    let g = take(&a, &key, Duration::from_secs(5)).await;
    assert_eq!(a.store().list(&key).await.unwrap().len(), 1);
    let waiter = spawn_waiter(b, &key, Duration::from_secs(10));
    let name = record_name(&key);
    await_until(Duration::from_secs(5), "the waiter registered", || {
        record(cluster, &name).contains("\"waiter\":\"b\"")
    })
    .await;
    let released = Instant::now();
    g.release().await.unwrap();
    let (got, at) = waiter.await.unwrap();
    got.expect("the waiter's lease").release().await.unwrap();
    assert!(at.duration_since(released) < Duration::from_millis(100));
    let wrong = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://locker:nope@");
    match leasehold::open_store(&wrong).await {
        Err(e) => {
            assert!(!e.is_retryable(), "{e}");
            assert!(!e.to_string().contains("nope"), "{e}");
        }
        Ok(_) => panic!("a wrong password was accepted"),
    }
}

/// Bad cluster URLs and keys are clear errors; seeds that do not answer are a retryable error; a
/// server without cluster support is a non-retryable one.
#[tokio::test]
async fn cluster_urls_and_keys_are_checked() {
    for bad in [
        "redis+cluster://",
        "redis+cluster://127.0.0.1",
        "redis+cluster://127.0.0.1:1,nohost",
        "redis+cluster://127.0.0.1:1/2",
        "redis+cluster://127.0.0.1:1?colour=red",
        "redis+cluster://127.0.0.1:1?ca=/tmp/ca.pem",
    ] {
        let res = leasehold::open_store(bad).await;
        assert!(
            matches!(res, Err(Error::InvalidUrl { .. })),
            "{bad}: {res:?}"
        );
    }
    for bad in [
        "redis+cluster://127.0.0.1:1?prefix=a{b}:",
        "redis+cluster://127.0.0.1:1?fence_prefix=f}",
    ] {
        let res = leasehold::open_store(bad).await;
        assert!(
            matches!(res, Err(Error::InvalidOption { .. })),
            "{bad}: {res:?}"
        );
    }
    let port = leasehold_testkit::servers::free_port();
    let res = leasehold::open_store(&format!(
        "redis+cluster://u:secret@127.0.0.1:{port}?timeout=300ms"
    ))
    .await;
    match res {
        Err(e) => {
            assert!(e.is_retryable(), "{e}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
        Ok(_) => panic!("connected to nothing"),
    }
    // A plain server (no cluster support) as the seed.
    let plain = leasehold_testkit::servers::shared_redis();
    let res = leasehold::open_store(&format!("redis+cluster://127.0.0.1:{}", plain.port)).await;
    match res {
        Err(e) => assert!(!e.is_retryable(), "{e}"),
        Ok(_) => panic!("a server without cluster support accepted as a cluster"),
    }
    // A key starting with `}` cannot be a hash tag.
    let l = locks(&shared_redis_cluster().url(), "k").await;
    let res = l.lock("}x").unwrap().try_acquire().await;
    assert!(matches!(res, Err(Error::InvalidKey { .. })), "{res:?}");
    // Braces elsewhere are fine.
    let g = take(
        &l,
        &leasehold_testkit::prefix("a}b{c"),
        Duration::from_secs(5),
    )
    .await;
    g.release().await.unwrap();
}

/// A record overwritten with a hash costs its own lease only, on a cluster too, where renewals
/// go one call per primary.
#[tokio::test]
async fn a_record_overwritten_with_another_type_costs_only_its_own_lease() {
    let cluster = shared_redis_cluster();
    leasehold_testkit::overwritten_with_a_hash(&cluster.url(), "leasehold:lock:", |args| {
        // The record's name is the command's second word; its key is the hash tag.
        let (stem, key) = args[1].split_at("leasehold:lock:".len());
        let name = format!("{stem}{{{key}}}");
        let mut line = args.to_vec();
        line[1] = &name;
        cluster.primary_for(&name).unwrap().command(&line).unwrap();
    })
    .await;
}

/// A primary that hangs (SIGSTOP: its connections stay open and silent, as behind a partition that
/// drops packets) gives the cluster connection no error to follow a failover by: the store
/// connects again, reads the slot map afresh and reaches the promoted replica — the lease held
/// since before the hang is renewed there, and a fresh key of the slot is granted there. Before,
/// every call to those slots ran out of time for as long as the old primary hung.
#[tokio::test]
async fn a_hung_primary_is_replaced_and_the_store_follows() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let port = cluster.nodes[0].port;
    let key = key_served_by(&cluster, port, "hung");
    let name = record_name(&key);
    let fresh = key_served_by(&cluster, port, "fresh");
    let a = locks(&format!("{}?timeout=500ms", cluster.url()), "a").await;
    // A lease that outlives the failover (the 2 s node timeout, then the election) with room.
    let g = take(&a, &key, Duration::from_secs(10)).await;
    // A contender subscribed on the node before it hangs, which only a notification wakes in
    // time: its subscription goes deaf with the node, and it must subscribe again on the
    // promoted replica to hear the release there.
    let waited = key_served_by(&cluster, port, "waited");
    let h = locks(&format!("{}?timeout=500ms", cluster.url()), "h").await;
    let hg = take(&h, &waited, Duration::from_secs(30)).await;
    let waiter = leasehold_testkit::spawn_deaf_waiter(
        locks(&format!("{}?timeout=500ms", cluster.url()), "w").await,
        &waited,
    );
    let waited_name = record_name(&waited);
    await_until(Duration::from_secs(10), "the contender subscribed", || {
        cluster.nodes[0]
            .command(&["GET", &waited_name])
            .is_some_and(|r| r.contains("\"watched\":true"))
    })
    .await;
    let replica = synced_replica(&cluster, port).await;
    cluster.nodes[0].pause();
    await_until(Duration::from_secs(20), "the replica promoted", || {
        replica
            .command(&["ROLE"])
            .is_some_and(|r| r.contains("master"))
    })
    .await;
    let promoted = Instant::now();
    loop {
        match a.lock(&fresh).unwrap().try_acquire().await {
            Ok(Some(g2)) => {
                g2.release().await.unwrap();
                break;
            }
            Ok(None) => panic!("{fresh} is free"),
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(
                    promoted.elapsed() < Duration::from_secs(10),
                    "still no grant 10 s after the promotion: {e}"
                );
            }
        }
    }
    let on_replica = || replica.command(&["GET", &name]).unwrap_or_default();
    let before = on_replica();
    await_until(
        Duration::from_secs(5),
        "a renewal on the promoted replica",
        || {
            let now = on_replica();
            now.contains("\"holder\":\"a\"") && now != before
        },
    )
    .await;
    assert!(g.is_current());
    g.release().await.unwrap();
    // An operator frees the contended key (through a store opened after the promotion); the
    // contender hears it on the promoted replica.
    leasehold_testkit::force_release_through(&cluster.url(), &waited).await;
    let wg = leasehold_testkit::woken_after(waiter, Instant::now(), "the contender").await;
    wg.release().await.unwrap();
    drop(hg);
    cluster.nodes[0].resume();
}

/// Script calls run by all the cluster's nodes.
fn script_calls(cluster: &RedisCluster) -> u64 {
    cluster.nodes.iter().map(RedisServer::script_calls).sum()
}

/// Acquisitions and releases that many tasks make at once share script calls on each primary
/// (one batch per primary, naming no keys), and each is answered as if alone: every one granted,
/// each key's fences rising, nothing left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_at_once_share_script_calls_on_each_primary() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let l = locks(&cluster.url(), "many").await;
    const TASKS: usize = 64;
    const ROUNDS: usize = 20;
    let before = script_calls(&cluster);
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (l, key) = (l.clone(), leasehold_testkit::prefix(&format!("many-{i}")));
            tokio::spawn(async move {
                let mut fences = vec![];
                for _ in 0..ROUNDS {
                    let g = take(&l, &key, Duration::from_secs(10)).await;
                    fences.push(g.fence());
                    g.release().await.unwrap();
                }
                fences
            })
        })
        .collect();
    for t in tasks {
        let fences = t.await.unwrap();
        assert!(fences.windows(2).all(|w| w[1] > w[0]), "{fences:?}");
    }
    let calls = script_calls(&cluster) - before;
    let ops = (2 * TASKS * ROUNDS) as u64;
    assert!(
        calls <= ops * 3 / 4,
        "{calls} script calls for {ops} acquisitions and releases: not coalesced"
    );
    let held = l.store().list("").await.unwrap();
    assert!(
        held.iter().all(|i| match i {
            leasehold::Inspection::Record(r) => !r.is_held(leasehold::now_ms()),
            _ => false,
        }),
        "{held:?}"
    );
}

/// Error replies a node has given, by their first word (`INFO errorstats`), MOVED and ASK left out.
fn errors(node: &RedisServer) -> u64 {
    let info = node.command(&["INFO", "errorstats"]).unwrap_or_default();
    info.lines()
        .filter(|l| l.starts_with("errorstat_"))
        .filter(|l| !l.starts_with("errorstat_MOVED:") && !l.starts_with("errorstat_ASK:"))
        .filter_map(|l| l.split("count=").nth(1)?.trim().parse::<u64>().ok())
        .sum()
}

/// A batch sent to a primary by a slot map a resharding made stale: the operations on keys that
/// primary no longer serves are answered there as elsewhere, without running, and sent again
/// naming their keys, which follow the cluster to the new primary. Every one is granted once,
/// where the cluster now keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_by_a_stale_slot_map_reaches_every_key() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let (source, target) = (&cluster.nodes[0], &cluster.nodes[1]);
    let stay = key_served_by(&cluster, source.port, "stay");
    let moved = key_served_by(&cluster, source.port, "moved");
    let name = record_name;
    let slot = reply_value(source.command(&["CLUSTER", "KEYSLOT", &name(&moved)]));
    assert_ne!(
        slot,
        reply_value(source.command(&["CLUSTER", "KEYSLOT", &name(&stay)]))
    );
    let l = locks(&format!("{}?timeout=1s", cluster.url()), "a").await;
    fresh_slot_map(&cluster, &l, &stay).await;
    // The (empty) slot moves to the target; the store's map still names the source.
    let target_id = reply_value(target.command(&["CLUSTER", "MYID"]));
    for node in &cluster.nodes[..3] {
        let reply = node
            .command(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])
            .unwrap_or_default();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    await_served_by(
        &cluster,
        &name(&moved),
        target.port,
        Duration::from_secs(10),
        "the slot on the target",
    )
    .await;
    let errors_before = errors(source) + errors(target);
    // Keys of the two slots (hash tags `{stay-N}` and `{moved-N}`), alternating, all at once.
    let keys: Vec<String> = (0..32)
        .map(|i| match i % 2 {
            0 => format!("{stay}}}-{i}"),
            _ => format!("{moved}}}-{i}"),
        })
        .collect();
    let guards = take_all_at_once(&l, &keys).await;
    assert!(
        errors(source) + errors(target) > errors_before,
        "no operation was answered elsewhere: the batches did not meet the stale map"
    );
    for (i, k) in keys.iter().enumerate() {
        let port = if i % 2 == 0 { source.port } else { target.port };
        let on = cluster.primary_for(&name(k)).map(|n| n.port);
        assert_eq!(on, Some(port), "{k}");
        assert!(
            record(&cluster, &name(k)).contains("\"holder\":\"a\""),
            "{k}"
        );
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Leaves the store of `l` with a fresh slot map (5 s): a renewal reads the map when it is
/// stale, so a lease on `key` is held until one renewal has been made.
async fn fresh_slot_map(cluster: &RedisCluster, l: &Locks, key: &str) {
    let g = take(l, key, Duration::from_millis(300)).await;
    await_renewal_by_a(cluster, &record_name(key), "a renewal").await;
    g.release().await.unwrap();
}

/// Calls of `CLUSTER SLOTS` (reads of the slot map) all the cluster's nodes have answered.
fn slot_map_reads(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes
        .iter()
        .map(|n| n.command_stat("cluster|slots", "calls"))
        .sum()
}

/// Values of another type (a hash: another client's lock, held until the server expires it) in
/// batches sent to their primaries: each is answered there as held by an unknown holder and left
/// as it is, as a lone call answers one, not taken for a key served elsewhere (which would send
/// it again alone and make the store read the slot map again); the other keys of the batch are
/// granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_values_of_another_type_on_their_primary() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let l = locks(&cluster.url(), "a").await;
    let name = record_name;
    let warm = leasehold_testkit::prefix("warm");
    fresh_slot_map(&cluster, &l, &warm).await;
    let keys: Vec<String> = (0..64)
        .map(|i| leasehold_testkit::prefix(&format!("typed-{i}")))
        .collect();
    // Every fourth record is a hash.
    for k in keys.iter().step_by(4) {
        let reply = cluster
            .primary_for(&name(k))
            .and_then(|n| n.command(&["HSET", &name(k), "f", "v"]))
            .unwrap_or_default();
        assert!(reply.starts_with(':'), "{reply}");
    }
    let (reads, calls) = (slot_map_reads(&cluster), script_calls(&cluster));
    let answers = try_all_at_once(&l, &keys).await;
    let calls = script_calls(&cluster) - calls;
    assert!(
        calls < 64,
        "{calls} script calls for 64 acquisitions: none shared"
    );
    let mut guards = vec![];
    for (i, (answer, k)) in answers.into_iter().zip(&keys).enumerate() {
        let answer = answer.unwrap();
        if i % 4 == 0 {
            assert!(answer.is_none(), "{k}: another client's hash was taken");
            let kind = cluster
                .primary_for(&name(k))
                .and_then(|n| n.command(&["TYPE", &name(k)]))
                .unwrap_or_default();
            assert!(kind.contains("hash"), "{k}: the hash was replaced ({kind})");
        } else {
            guards.push(answer.unwrap_or_else(|| panic!("{k} not granted")));
            assert!(
                record(&cluster, &name(k)).contains("\"holder\":\"a\""),
                "{k}"
            );
        }
    }
    for g in guards {
        g.release().await.unwrap();
    }
    assert_eq!(
        slot_map_reads(&cluster),
        reads,
        "the slot map was read again: a value of another type was taken for a key served elsewhere"
    );
}

/// A primary that refuses a batch before running it (here out of memory, as a server before
/// Redis 7 refuses the batch's script flag) gets its operations sent again alone: each is
/// answered on its own — out of memory, a retryable error naming it — and none hangs; once the
/// primary takes writes again, the same burst is granted in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_a_primary_refuses_is_sent_again_alone() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let primary = &cluster.nodes[0];
    let l = locks(&cluster.url(), "a").await;
    let name = record_name;
    let warm = key_served_by(&cluster, primary.port, &leasehold_testkit::prefix("warm"));
    fresh_slot_map(&cluster, &l, &warm).await;
    let keys: Vec<String> = (0..)
        .map(|i| leasehold_testkit::prefix(&format!("refused-{i}")))
        .filter(|k| {
            cluster
                .primary_for(&name(k))
                .is_some_and(|n| n.port == primary.port)
        })
        .take(24)
        .collect();
    let set_maxmemory = |bytes: &str| {
        let reply = primary.command(&["CONFIG", "SET", "maxmemory", bytes]);
        assert!(
            reply.as_deref().is_some_and(|r| r.starts_with("+OK")),
            "{reply:?}"
        );
    };
    set_maxmemory("1");
    // A script's first call on the node is `EVALSHA`, answered `NOSCRIPT`, then `EVAL`.
    let stat =
        |field: &str| primary.command_stat("evalsha", field) + primary.command_stat("eval", field);
    let (rejected, failed) = (stat("rejected_calls"), stat("failed_calls"));
    let answers = try_all_at_once(&l, &keys).await;
    for (answer, k) in answers.into_iter().zip(&keys) {
        let err = answer.expect_err("no writes while out of memory");
        assert!(
            err.is_retryable() && err.to_string().contains("OOM"),
            "{k}: {err}"
        );
    }
    // A batch (a script with flags) is refused before it runs; then each acquisition, sent alone
    // (a script without flags), fails at its first write. (A `NOSCRIPT` answer, to a script's
    // first `EVALSHA` on this node, counts as failed too.)
    let (rejected, failed) = (
        stat("rejected_calls") - rejected,
        stat("failed_calls") - failed,
    );
    assert!(rejected >= 1, "no batch was refused");
    assert!(
        failed >= 24,
        "{failed} calls failed for 24 acquisitions: not each alone"
    );
    set_maxmemory("0");
    let guards = take_all_at_once(&l, &keys).await;
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Whether the replica `replica` has the record `name` held by `holder` (read with `READONLY`,
/// which lets a cluster replica answer for its primary's slots).
fn on_replica(replica: &RedisServer, name: &str, holder: &str) -> bool {
    leasehold_testkit::servers::commands_on(replica.port, &[&["READONLY"], &["GET", name]])
        .is_some_and(|r| r.contains(&format!("\"holder\":\"{holder}\"")))
}

/// `?replicas=1` on a cluster: each grant is answered once the replica of the primary serving
/// its key has it — alone and in a batch sent to that primary — and renewals likewise. While
/// one primary's replica does not answer (SIGSTOP), grants there fail retryably and are not left
/// held, alone or batched, and a lease held there is lost before its TTL runs out; the other
/// primaries go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_acknowledge_grants_on_each_primary() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let (stalled, going) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let url = format!(
        "{}?replicas=1&replicas_timeout=300ms&timeout=5s",
        cluster.url()
    );
    let a = locks(&url, "a").await;
    let key = key_served_by(&cluster, stalled, "rep");
    let replica = synced_replica(&cluster, stalled).await;
    let g = take(&a, &key, Duration::from_secs(5)).await;
    assert!(on_replica(replica, &record_name(&key), "a"));
    g.release().await.unwrap();
    fresh_slot_map(&cluster, &a, &key_served_by(&cluster, going, "warm")).await;
    let there = keys_served_by(&cluster, stalled, "there", 16);
    let elsewhere = keys_served_by(&cluster, going, "elsewhere", 16);
    let guards = take_all_at_once(&a, &there).await;
    for k in &there {
        assert!(on_replica(replica, &record_name(k), "a"), "{k}");
    }
    for g in guards {
        g.release().await.unwrap();
    }

    let held = take(&a, &key, Duration::from_millis(1500)).await;
    let kept = take(&a, &elsewhere[0], Duration::from_millis(1500)).await;
    // Every renewal acknowledged was sent before this: the lease runs out within its TTL of it.
    let stopped = Instant::now();
    replica.pause();
    let lost_at = tokio::spawn(async move {
        held.lost().await;
        Instant::now()
    });
    let e = a
        .lock(key_served_by(&cluster, stalled, "alone"))
        .unwrap()
        .try_acquire()
        .await;
    let e = e.map(|_| ()).unwrap_err();
    leasehold_testkit::assert_not_replicated(&e, "an acquisition");
    for (k, answer) in there.iter().zip(try_all_at_once(&a, &there).await) {
        let e = answer.map(|_| ()).unwrap_err();
        // A batch behind the hung replica may run out of the store's time before its WAIT
        // answers: retryable too, and (checked next) nothing left held.
        assert!(
            e.is_retryable()
                && ["replicas", "no answer in time"]
                    .iter()
                    .any(|w| e.to_string().contains(w)),
            "{k}: {e}"
        );
        let left = cluster
            .primary_for(&record_name(k))
            .and_then(|n| n.command(&["GET", &record_name(k)]));
        assert!(left.is_some_and(|r| r.starts_with("$-1")), "{k} is held");
    }
    let guards = take_all_at_once(&a, &elsewhere[1..]).await;
    let lost_at = tokio::time::timeout(Duration::from_secs(3), lost_at)
        .await
        .expect("lost() fires")
        .unwrap();
    assert!(lost_at.duration_since(stopped) < Duration::from_millis(1500));
    if !kept.is_current() {
        let why = tokio::time::timeout(Duration::ZERO, kept.lost()).await;
        panic!("a lease on another primary was lost: {why:?}");
    }
    replica.resume();
    for g in guards {
        g.release().await.unwrap();
    }
    kept.release().await.unwrap();
}

/// With `?replicas=1`, a primary whose replica stops answering holds up no lease on the others:
/// each call there holds its connection for `replicas_timeout` (Redis blocks a client in `WAIT`),
/// yet 1 s leases on the other primary stay alive past the slot map's age, though their renewals
/// read the map again then (`CLUSTER SLOTS`, which any primary can answer: a read sent to a
/// stalled one alone would wait up to 3 s). Several stores, each with calls waiting on two
/// stalled primaries all along, so that a read waiting behind them shows in at least one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_waiting_for_its_replica_holds_up_no_renewal_elsewhere() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let going = cluster.nodes[1].port;
    let stalled = [cluster.nodes[0].port, cluster.nodes[2].port];
    let url = format!(
        "{}?replicas=1&replicas_timeout=3s&timeout=4s",
        cluster.url()
    );
    let kept = keys_served_by(&cluster, going, "kept", 8);
    let mut stores = vec![];
    let mut guards = vec![];
    for k in &kept {
        let l = locks(&url, "a").await;
        guards.push(take(&l, k, Duration::from_secs(1)).await);
        stores.push(l);
    }
    let replicas: Vec<&RedisServer> = stalled
        .iter()
        .flat_map(|&p| cluster.replicas_of(p))
        .collect();
    assert_eq!(replicas.len(), 2, "a replica of each stalled primary");
    // Found before the replicas stop (finding asks every node).
    let busy_keys: Vec<Vec<String>> = (0..stores.len())
        .map(|i| {
            let stem = format!("busy-{i}");
            stalled
                .map(|port| key_served_by(&cluster, port, &stem))
                .to_vec()
        })
        .collect();
    for r in &replicas {
        r.pause();
    }
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut loops = vec![];
    for (l, keys) in stores.iter().zip(busy_keys) {
        for key in keys {
            let (l, busy) = (l.clone(), busy.clone());
            loops.push(tokio::spawn(async move {
                while busy.load(std::sync::atomic::Ordering::Relaxed) {
                    // Keeps a call waiting there; the answers are other tests' matter (a
                    // grant comes once the replica answers again).
                    if let Ok(Some(g)) = l.lock(&key).unwrap().try_acquire().await {
                        g.release().await.unwrap();
                    }
                }
            }));
        }
    }
    // Past the slot map's age (5 s) and a renewal period after it: each store has read the map
    // again in a renewal.
    tokio::time::sleep(Duration::from_millis(6500)).await;
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    for r in &replicas {
        r.resume();
    }
    for t in loops {
        t.await.unwrap();
    }
    for (k, g) in kept.iter().zip(guards) {
        if !g.is_current() {
            let why = tokio::time::timeout(Duration::ZERO, g.lost()).await;
            panic!("{k}, on a primary with its replica, was lost: {why:?}");
        }
        g.release().await.unwrap();
    }
}

/// A primary that lacks the store's scripts (flushed here; a promoted replica or a restarted node
/// has none) answers `NOSCRIPT`, and the store calls again there with the script (`EVAL`) — there
/// alone: another primary that hangs meanwhile (SIGSTOP) holds up neither the grant nor the
/// release, on a store doing nothing else.
#[tokio::test]
async fn a_primary_without_the_scripts_gets_them_while_another_hangs() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let going = cluster.nodes[1].port;
    let key = key_served_by(&cluster, going, "flushed");
    let a = locks(&cluster.url(), "a").await;
    take(&a, &key, Duration::from_secs(2))
        .await
        .release()
        .await
        .unwrap();
    for primary in &cluster.nodes[..3] {
        assert!(primary
            .command(&["SCRIPT", "FLUSH"])
            .is_some_and(|r| r.starts_with("+OK")));
    }
    cluster.nodes[0].pause();
    let started = Instant::now();
    let granted = a.lock(&key).unwrap().try_acquire().await;
    let released = match granted {
        Ok(Some(g)) => g.release().await.map(|_| "released"),
        Ok(None) => Ok("held"),
        Err(e) => Err(e),
    };
    let took = started.elapsed();
    cluster.nodes[0].resume();
    assert_eq!(released.unwrap(), "released");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

/// With `?replicas=1`, the calls that wait for replicas have connections of their own: while a
/// primary's replica does not answer (SIGSTOP) and an acquisition there waits out
/// `replicas_timeout` in `WAIT`, a lease held on that primary is inspected and released at once,
/// not behind it; the acquisition still fails, and leaves nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_answer_holds_up_no_release_on_its_primary() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let stalled = cluster.nodes[0].port;
    let url = format!(
        "{}?replicas=1&replicas_timeout=1500ms&timeout=3s",
        cluster.url()
    );
    let a = locks(&url, "a").await;
    let (key, other) = (
        key_served_by(&cluster, stalled, "held"),
        key_served_by(&cluster, stalled, "other"),
    );
    let replica = synced_replica(&cluster, stalled).await;
    let held = take(&a, &key, Duration::from_secs(30)).await;
    replica.pause();
    let waiting = {
        let (a, other) = (a.clone(), other.clone());
        tokio::spawn(async move { a.lock(other).unwrap().try_acquire().await.map(|_| ()) })
    };
    cluster.nodes[0].a_client_blocked().await.unwrap();
    let seen = answered_at_once("an inspection", a.store().inspect(held.key())).await;
    assert!(seen.unwrap().is_some(), "the held record was not found");
    let released = answered_at_once("a release", held.release()).await;
    assert_eq!(released.unwrap(), Released::Released);
    let e = waiting.await.unwrap().unwrap_err();
    leasehold_testkit::assert_not_replicated(&e, "an acquisition");
    for k in [&key, &other] {
        let left = cluster.nodes[0].command(&["GET", &record_name(k)]);
        assert!(left.is_some_and(|r| r.starts_with("$-1")), "{k} is held");
    }
    replica.resume();
}

/// The cluster's URL as user `locker` (password `s3cret`), made on every node (ACLs are per
/// node) with the README's line plus `+cluster|slots`.
fn locker_on_every_node(cluster: &RedisCluster) -> String {
    let rule = format!("{} +cluster|slots", leasehold_testkit::servers::LOCKER_ACL);
    let mut args = vec!["ACL", "SETUSER"];
    args.extend(rule.split(' '));
    for n in &cluster.nodes {
        assert!(
            n.command(&args).is_some_and(|r| r.starts_with("+OK")),
            "{rule}"
        );
    }
    cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://locker:s3cret@")
}

/// Credentials the cluster stops accepting after the store started (the user switched off on
/// every node, its connections killed): a waiting acquire fails at once with a non-retryable
/// error naming authentication, not a retryable "no connections found" that waits out its
/// limit; once the nodes accept the credentials again, the next acquire goes through.
#[tokio::test]
async fn credentials_the_cluster_refuses_then_accepts() {
    let _alone = ALONE.lock().await;
    let cluster = RedisCluster::start();
    let url = locker_on_every_node(&cluster);
    let a = locks(&format!("{url}?timeout=2s"), "a").await;
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    leasehold_testkit::refused_then_accepted(&a, &nodes, true).await;
}
