//! Redlock with real servers and real faults: nodes stopped, nodes restarted empty.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{Error, LeaseGuard, Locks};
use leasehold_testkit::servers::{
    redlock_url, redlock_url_of, GarbageServer, Pausable, RedisServer, LOCKER_ACL,
};
use std::time::Duration;

fn three() -> Vec<RedisServer> {
    (0..3).map(|_| RedisServer::start()).collect()
}

async fn locks(servers: &[RedisServer], holder: &str) -> Locks {
    leasehold_testkit::connect_as(&redlock_url(servers), holder).await
}

/// `try_acquire` of `key` with `ttl` (the default when `None`): the guard, or `None` when held.
async fn take(l: &Locks, key: &str, ttl: Option<Duration>) -> Option<LeaseGuard> {
    let mut lock = l.lock(key).unwrap();
    if let Some(ttl) = ttl {
        lock = lock.ttl(ttl);
    }
    lock.try_acquire().await.unwrap()
}

#[tokio::test]
async fn one_of_three_stopped_still_grants() {
    let mut s = three();
    s[2].stop();
    let a = locks(&s, "a").await;
    let g = take(&a, "job", Some(Duration::from_millis(900)))
        .await
        .expect("granted by 2 of 3");
    assert!(take(&locks(&s, "b").await, "job", None).await.is_none());
    // Renewal works with the majority too.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(g.is_current());
    g.release().await.unwrap();
}

/// A node that is not a Redis server (a misconfigured port: it answers everything with garbage)
/// counts as a node that failed, never as a grant or a panic, and is not waited for: with the two
/// real nodes the lease is granted, refused to a contender, renewed and released; with only one
/// real node, acquiring fails naming the two others as not Redis, not retryable (as one such
/// server is, and as refused credentials are: waiting would not help).
#[tokio::test]
async fn a_node_that_answers_garbage_is_counted_as_failed() {
    let s: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let garbage = [GarbageServer::start(), GarbageServer::start()];
    let (bad, worse) = (garbage[0].port, garbage[1].port);
    let url = |ports: [u16; 3]| format!("{}?timeout=300ms", redlock_url_of(&ports));
    let two_real = url([s[0].port, bad, s[1].port]);
    let a = leasehold_testkit::connect_as(&two_real, "a").await;
    let g = take(&a, "job", Some(Duration::from_millis(900)))
        .await
        .expect("granted by the 2 real nodes");
    let b = leasehold_testkit::connect_as(&two_real, "b").await;
    assert!(take(&b, "job", None).await.is_none());
    // Renewals keep it with the two real nodes, past its TTL.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(g.is_current());
    assert_eq!(g.release().await.unwrap(), leasehold::Released::Released);
    let one_real = leasehold_testkit::connect_as(&url([s[0].port, bad, worse]), "c").await;
    let err = no_majority(&one_real, &[bad, worse]).await;
    assert!(!err.is_retryable(), "{err}");
    assert_eq!(err.to_string().matches("not Redis").count(), 2, "{err}");
}

/// Acquiring through `l` fails for want of a majority: an error naming each of the nodes on
/// `down`; the error, for further checks.
async fn no_majority(l: &Locks, down: &[u16]) -> Error {
    let err = l
        .lock("job")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("no majority");
    let msg = err.to_string();
    for p in down {
        assert!(msg.contains(&p.to_string()), "{msg} does not name node {p}");
    }
    err
}

#[tokio::test]
async fn two_of_three_stopped_fails_naming_the_unreachable_nodes() {
    let mut s = three();
    let down = [s[0].port, s[1].port];
    s[0].stop();
    s[1].stop();
    let a = locks(&s, "a").await;
    let err = no_majority(&a, &down).await;
    assert!(err.is_retryable(), "{err}");
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        !msg.contains(&format!("{} (", s[2].port)),
        "{msg} names the live node as unreachable"
    );
    assert!(
        msg.contains("only 1 of 3 nodes answered, 2 needed"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_lease_holder_keeps_renewing_while_a_node_restarts_empty() {
    let mut s = three();
    let a = locks(&s, "a").await;
    let g = take(&a, "job", Some(Duration::from_millis(900)))
        .await
        .unwrap();
    let port = s[0].port;
    s[0].stop();
    s[0] = RedisServer::start_on(port);
    // The restarted node forgot the lease, the other two did not: nobody else gets it.
    let b = locks(&s, "b").await;
    assert!(take(&b, "job", None).await.is_none());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        g.is_current(),
        "renewals by the remaining majority keep the lease"
    );
    g.release().await.unwrap();
}

/// The documented limit: when a majority of nodes restarts empty while a lease is held, a second
/// holder can be granted it, and its fence is lower — which is exactly what a fenced resource
/// rejects.
#[tokio::test]
async fn a_majority_restarted_empty_breaks_exclusion_and_the_fence_shows_it() {
    let mut s = three();
    let a = locks(&s, "a").await;
    // Give the first holder a high fence (many earlier acquisitions).
    for _ in 0..5 {
        let g = a.lock("job").unwrap().try_acquire().await.unwrap().unwrap();
        g.release().await.unwrap();
    }
    let first = take(&a, "job", Some(Duration::from_secs(2))).await.unwrap();
    for node in s.iter_mut().take(2) {
        let port = node.port;
        node.stop();
        *node = RedisServer::start_on(port);
    }
    let b = locks(&s, "b").await;
    let second = take(&b, "job", None)
        .await
        .expect("granted by the two amnesiac nodes");
    assert!(
        first.is_current(),
        "the first holder does not know yet (it learns at its next renewal)"
    );
    assert!(
        second.fence() < first.fence(),
        "fence {} of the second holder is not below {}: the resource could not tell them apart",
        second.fence(),
        first.fence()
    );
    // A fenced resource that saw the first holder's fence rejects the second holder's writes.
    let highest_seen = first.fence();
    assert!(second.fence() < highest_seen);
    let reason = tokio::time::timeout(Duration::from_secs(3), first.lost())
        .await
        .expect("first holder learns");
    eprintln!("first holder: {reason}");
    second.release().await.unwrap();
}

/// Per-node fence counters drift apart (here: one node far ahead, as after many grants it alone
/// counted). The granted fence is the maximum over the granting nodes, and the granting nodes that
/// lag are raised to it, so a later majority without the node that was ahead still grants a higher
/// fence.
#[tokio::test]
async fn fences_stay_increasing_when_node_counters_differ() {
    let mut s = three();
    ahead(&s[0]);
    // With node 2 down, the majority is nodes 0 and 1: node 0's counter must count.
    let port2 = s[2].port;
    s[2].stop();
    let a = locks(&s, "a").await;
    let first = a.lock("job").unwrap().try_acquire().await.unwrap().unwrap();
    assert_eq!(first.fence(), 101, "the maximum over the granting nodes");
    first.release().await.unwrap();
    assert_eq!(
        s[1].command(&["GET", "leasehold:fence:job"]).as_deref(),
        Some("$3\r\n101\r\n"),
        "the lagging granting node was not raised"
    );
    // Node 2 back (empty), node 0 — the one that was ahead — down: nodes 1 and 2 grant.
    s[2] = RedisServer::start_on(port2);
    s[0].stop();
    fence_rises(&a, first.fence()).await;
}

/// `redlock://user:pass@…` authenticates on every node; a wrong password is a non-retryable error
/// at once (a waiter does not wait out its limit), not an "unreachable nodes" one.
#[tokio::test]
async fn acl_users_and_passwords_apply_to_every_node() {
    let s: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_users(&[LOCKER_ACL]))
        .collect();
    let url = |cred: &str| redlock_url(&s).replacen("redlock://", &format!("redlock://{cred}@"), 1);
    let a = leasehold_testkit::connect_as(&url("locker:s3cret"), "a").await;
    let g = take(&a, "job", Some(Duration::from_millis(600)))
        .await
        .expect("granted");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(g.is_current(), "renewals went through on every node");
    for node in &s {
        let record = node.command(&["GET", "leasehold:lock:job"]).unwrap();
        assert!(record.contains("\"holder\":\"a\""), "{record}");
    }
    g.release().await.unwrap();

    let b = leasehold_testkit::connect_as(&url("locker:nope"), "b").await;
    let started = std::time::Instant::now();
    let err = b
        .lock("job")
        .unwrap()
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect_err("wrong password");
    let text = err.to_string();
    assert!(!err.is_retryable(), "{text}");
    assert!(started.elapsed() < Duration::from_secs(2), "{text}");
    assert!(text.to_lowercase().contains("auth"), "{text}");
    assert!(!text.contains("nope"), "{text}");
}

/// A node that refused the credentials is used again once it accepts them (a user provisioned
/// there late): the store connects to it anew rather than keep the refused connection. Here the
/// one node that refused comes back while another starts refusing, so the lease needs it.
#[tokio::test]
async fn a_node_that_accepts_the_credentials_again_is_used_again() {
    let s: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_users(&[LOCKER_ACL]))
        .collect();
    s[1].command(&["ACL", "SETUSER", "locker", "off"]).unwrap();
    let url = redlock_url(&s).replacen("redlock://", "redlock://locker:s3cret@", 1);
    // A timeout long enough that the refusal, not a call running out of time, is what the node
    // answers.
    let a = leasehold_testkit::connect_as(&format!("{url}?timeout=2s"), "a").await;
    let g = take(&a, "job", None)
        .await
        .expect("granted by nodes 0 and 2");
    g.release().await.unwrap();
    s[1].command(&["ACL", "SETUSER", "locker", "on"]).unwrap();
    s[0].command(&["ACL", "SETUSER", "locker", "off"]).unwrap();
    s[0].command(&["CLIENT", "KILL", "USER", "locker"]).unwrap();
    let g = take(&a, "job", None)
        .await
        .expect("granted by nodes 1 and 2");
    let record = s[1].command(&["GET", "leasehold:lock:job"]).unwrap();
    assert!(record.contains("\"holder\":\"a\""), "{record}");
    g.release().await.unwrap();
}

/// A node that answers but refuses (here a stale record of another holder, as a minority grant
/// not undone or a waiter registered there alone leaves) is raised to the granted fence too: else
/// it and a node restarted empty would later make a majority that grants a lower fence — the
/// fault harness (tests/chaos.rs) saw the same fence granted twice that way.
#[tokio::test]
async fn a_node_that_refused_is_raised_to_the_granted_fence() {
    let mut s = three();
    ahead(&s[0]);
    let stale = r#"{"key":"job","holder":"gone","token":"t-gone","fence":7,"acquired":0,"renewed":0,"expires":99999999999999,"ttl_ms":60000,"waiter":null,"waiter_token":null,"waiter_expires":null,"labels":{}}"#;
    assert_eq!(
        s[1].command(&["SET", "leasehold:lock:job", stale, "PX", "60000"])
            .as_deref(),
        Some("+OK\r\n")
    );
    let a = locks(&s, "a").await;
    let first = take(&a, "job", None)
        .await
        .expect("granted by nodes 0 and 2");
    assert_eq!(first.fence(), 101);
    first.release().await.unwrap();
    assert_eq!(
        s[1].command(&["GET", "leasehold:fence:job"]).as_deref(),
        Some("$3\r\n101\r\n"),
        "the node that refused was not raised"
    );
    // Node 2 restarted empty, node 0 (ahead) down, node 1's stale record gone: nodes 1 and 2
    // grant, and the fence still rises.
    let port2 = s[2].port;
    s[2].stop();
    s[2] = RedisServer::start_on(port2);
    s[0].stop();
    assert!(s[1]
        .command(&["DEL", "leasehold:lock:job"])
        .is_some_and(|r| r.starts_with(':')));
    fence_rises(&a, first.fence()).await;
}

/// Puts node `server`'s fence counter of `job` far ahead of the others', at 100.
fn ahead(server: &RedisServer) {
    assert_eq!(
        server
            .command(&["SET", "leasehold:fence:job", "100"])
            .as_deref(),
        Some("+OK\r\n")
    );
}

/// Waits for `job` (riding over nodes reconnecting: the store retries unavailable nodes) and
/// checks that its fence is above `before`.
async fn fence_rises(a: &Locks, before: u64) {
    let second = a
        .lock("job")
        .unwrap()
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(
        second.fence() > before,
        "fence {} from the other two nodes is not above {before}",
        second.fence()
    );
    second.release().await.unwrap();
}

/// A node that hangs (SIGSTOP: its connections stay open and silent, as behind a partition that
/// drops packets) costs one per-node timeout, not one per call: it is left out while the other two
/// make a majority, and taken back once it answers again.
#[tokio::test]
async fn a_hung_node_is_left_out_until_it_answers_again() {
    let s = three();
    let a = locks(&s, "a").await;
    s[2].pause();
    // 20 acquire+release cycles: waiting for the hung node in each would take 40 × 200 ms = 8 s.
    let started = std::time::Instant::now();
    for i in 0..20 {
        let g = take(&a, &format!("k{i}"), None)
            .await
            .expect("granted by the two nodes that answer");
        g.release().await.unwrap();
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "20 cycles took {took:?}: the hung node is waited for"
    );
    // Renewals by the two others keep a lease whose TTL passes meanwhile.
    let held = take(&a, "held", Some(Duration::from_millis(900)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(held.is_current(), "renewed by the majority that answers");
    // Others are still refused it: the left-out node counts as a node that is down.
    let b = locks(&s, "b").await;
    assert!(take(&b, "held", None).await.is_none());

    // Answering again, the node is probed back in and gets new leases again.
    s[2].resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut n = 0;
    loop {
        let key = format!("back{n}");
        let g = a.lock(&key).unwrap().try_acquire().await.unwrap().unwrap();
        let there = s[2].command(&["EXISTS", &format!("leasehold:lock:{key}")]);
        g.release().await.unwrap();
        if there.as_deref().is_some_and(|r| r.contains('1')) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node that answers again never got a lease back"
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
}
