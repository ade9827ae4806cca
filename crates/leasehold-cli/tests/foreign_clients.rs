//! `leasehold run` next to other clients of the same locks, as a rolling upgrade runs them: the
//! official Kubernetes Python client's leader election on a Lease and redis-py's `Lock` on Redis
//! keys, all real processes against real servers the test kit starts.
//!
//! Each side logs when it starts and ends its work on one monotonic clock
//! ([`leasehold_testkit::foreign::EventLog`]): no two working intervals may overlap, and a lock
//! another client holds is taken only once that client stopped renewing it and it expired.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::foreign::{self, EventLog, Proc, FOREIGN_LEASE_SECONDS};
use leasehold_testkit::servers::{redlock_url, shared_apiserver, shared_redis, shared_redis_nodes};
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// The longest any single step may take before the test fails (not a sleep: an upper bound).
const LIMIT: Duration = Duration::from_secs(30);

/// How much earlier than its holder's last renewal + lease duration a takeover may be seen on
/// the shared clock: the holder logs a renewal after the API server answered it, up to a request
/// later than the renewTime it wrote.
const SLACK: Duration = Duration::from_millis(1000);

/// `leasehold run --key KEY --ttl 3s -- <work for seconds>` on `store`, logging as `who`.
fn leasehold_run(
    store: &str,
    env: &[(&str, &std::path::Path)],
    key: &str,
    log: &EventLog,
    who: &str,
    seconds: f64,
) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_LOG")
        .args(["--store", store, "run", "--key", key, "--ttl", "3s", "--"])
        .args(log.worker(who, seconds));
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn(cmd, &format!("leasehold run as {who}"))
}

/// Asserts that `who` started working no earlier than `holder`'s last renewal + its lease.
fn taken_after_expiry(log: &EventLog, holder: &str, who: &str, lease: Duration) {
    let renewed = log.last(holder, "renew").expect("the holder renewed");
    let started = log.last(who, "start").expect("leasehold worked");
    assert!(
        started + SLACK.as_nanos() as u64 >= renewed + lease.as_nanos() as u64,
        "{who} started {:.3} s after {holder}'s last renewal, before its lease of {lease:?} ran out:\n{}",
        started.saturating_sub(renewed) as f64 / 1e9,
        log.shown()
    );
}

#[test]
fn a_lease_python_leader_election_holds_is_taken_only_after_its_holder_stops_renewing() {
    let api = shared_apiserver();
    let ns = "foreign";
    let lease = "py-first";
    let log = EventLog::new();
    let kubeconfig = api.kubeconfig(ns);
    let store = format!("k8s://{ns}?prefix=");
    let mut py = foreign::k8s_leader(api, ns, lease, "py-a", &log, 5.0);
    py.wait_line("leading", LIMIT);
    // leasehold waits (registering as the waiter) while the Python client leads and renews.
    let mut lh = leasehold_run(
        &store,
        &[("KUBECONFIG", &kubeconfig)],
        lease,
        &log,
        "leasehold",
        1.0,
    );
    py.succeeds(LIMIT);
    lh.wait_line("working", LIMIT);
    lh.succeeds(LIMIT);
    let worked = log.working();
    let who: Vec<&str> = worked.iter().map(|w| w.who.as_str()).collect();
    assert_eq!(who, ["py-a", "leasehold"], "{}", log.shown());
    taken_after_expiry(
        &log,
        "py-a",
        "leasehold",
        Duration::from_secs(FOREIGN_LEASE_SECONDS),
    );
}

#[test]
fn python_leader_election_and_leasehold_take_turns_on_a_lease_leasehold_used_before() {
    let api = shared_apiserver();
    let ns = "foreign";
    let lease = "lh-first";
    let log = EventLog::new();
    let kubeconfig = api.kubeconfig(ns);
    let env = [("KUBECONFIG", kubeconfig.as_path())];
    let store = format!("k8s://{ns}?prefix=");
    let mut first = leasehold_run(&store, &env, lease, &log, "leasehold-1", 3.0);
    first.wait_line("working", LIMIT);
    // The Python client waits while leasehold holds and renews, and leads once it released.
    let mut py = foreign::k8s_leader(api, ns, lease, "py-b", &log, 4.0);
    py.wait_line("leading", LIMIT);
    first.succeeds(LIMIT);
    // The Lease keeps leasehold's annotations (its key, fence, no token) under the Python
    // client's holderIdentity: leasehold waits for that holder.
    let mut second = leasehold_run(&store, &env, lease, &log, "leasehold-2", 1.0);
    py.succeeds(LIMIT);
    second.wait_line("working", LIMIT);
    second.succeeds(LIMIT);
    let worked = log.working();
    let who: Vec<&str> = worked.iter().map(|w| w.who.as_str()).collect();
    assert_eq!(
        who,
        ["leasehold-1", "py-b", "leasehold-2"],
        "{}",
        log.shown()
    );
    taken_after_expiry(
        &log,
        "py-b",
        "leasehold-2",
        Duration::from_secs(FOREIGN_LEASE_SECONDS),
    );
}

/// `leasehold ARGS…` on `store`, run to its end: exit code and stdout.
fn leasehold(store: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_LOG")
        .args(["--store", store])
        .args(args);
    let (status, out) = Proc::spawn(cmd, &format!("leasehold {args:?}")).finish(LIMIT);
    (status.code(), out)
}

/// A key of its own for one test.
fn agent_key(what: &str) -> String {
    format!("agent-{what}-{:08x}", fastrand::u32(..))
}

/// leasehold and redis-py's `Lock` take turns on `agent:lock:KEY` through `store` (on the Redis
/// servers `ports`): leasehold works, redis-py waits and then holds the key, renewing it, and
/// leasehold waits until that key expired after its last renewal.
fn takes_turns_with_redis_py(store: &str, ports: &[u16], key: &str) {
    let log = EventLog::new();
    let name = format!("agent:lock:{key}");
    let mut first = leasehold_run(store, &[], key, &log, "leasehold-1", 2.0);
    first.wait_line("working", LIMIT);
    let mut py = foreign::redis_lock(ports, &name, "py-c", &log, 4.0, 3000);
    py.wait_line("locked", LIMIT);
    first.succeeds(LIMIT);
    // The key holds redis-py's random token, which leasehold cannot read: held until it expires.
    let mut second = leasehold_run(store, &[], key, &log, "leasehold-2", 1.0);
    second.wait_line("working", LIMIT);
    let statuses = [py.wait(LIMIT), second.wait(LIMIT)];
    // The log first: it shows who worked when, and who lost its lock.
    let worked = log.working();
    let who: Vec<&str> = worked.iter().map(|w| w.who.as_str()).collect();
    assert_eq!(
        who,
        ["leasehold-1", "py-c", "leasehold-2"],
        "{}",
        log.shown()
    );
    assert!(statuses.iter().all(|s| s.success()), "{statuses:?}");
    taken_after_expiry(&log, "py-c", "leasehold-2", Duration::from_secs(3));
}

#[test]
fn redis_py_lock_and_leasehold_take_turns_on_one_server() {
    let server = shared_redis();
    let store = format!("{}?prefix=agent:lock:", server.url());
    takes_turns_with_redis_py(&store, &[server.port], &agent_key("one"));
}

#[test]
fn redis_py_lock_on_every_redlock_node_and_leasehold_take_turns() {
    let nodes = &shared_redis_nodes()[..3];
    let store = format!("{}?prefix=agent:lock:", redlock_url(nodes));
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    takes_turns_with_redis_py(&store, &ports, &agent_key("redlock"));
}

#[test]
fn a_value_another_client_left_without_a_ttl_is_held_until_deleted_and_reported() {
    let one = &shared_redis_nodes()[3..4];
    let nodes = &shared_redis_nodes()[..3];
    for (store, servers) in [(one[0].url(), one), (redlock_url(nodes), nodes)] {
        let store = format!("{store}?prefix=agent:lock:");
        let key = agent_key("nottl");
        let name = format!("agent:lock:{key}");
        for s in servers {
            assert!(s.command(&["SET", &name, "a-token"]).is_some());
        }
        let (code, _) = leasehold(&store, &["run", "--key", &key, "--no-wait", "--", "true"]);
        assert_eq!(code, Some(75), "{store}: held, not taken");
        let (code, out) = leasehold(&store, &["inspect", &key, "--json"]);
        assert_eq!(code, Some(0), "{store}: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["holder"], "unknown (foreign value: a string of 7 bytes; no TTL: held until deleted)",
            "{store}: {v}"
        );
        assert_eq!(v["state"], "held", "{store}: {v}");
        for s in servers {
            let value = s.command(&["GET", &name]).unwrap_or_default();
            assert!(
                value.contains("a-token"),
                "{store}: never replaced: {value:?}"
            );
            assert!(s.command(&["DEL", &name]).is_some());
        }
        let (code, _) = leasehold(&store, &["run", "--key", &key, "--no-wait", "--", "true"]);
        assert_eq!(code, Some(0), "{store}: free once deleted");
    }
}
