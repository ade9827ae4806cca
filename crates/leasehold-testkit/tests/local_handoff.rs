//! Local handoff across real processes: 3 OS processes × 4 tasks contend on one key. Inside a
//! process the lease goes from task to task without a store call (fences from a reserved block);
//! across processes it goes through the store. Never two holders at once, and the fences, in the
//! order the holders entered, strictly increase — on the file store, Redis (over TCP, a Unix socket,
//! Sentinel and a Redis Cluster, the last two also with `?replicas=1`) and 3-node Redlock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::{redlock_url, shared_redis, shared_redis_nodes};

const WORKER: &str = env!("CARGO_BIN_EXE_leasehold-worker");
const PROCESSES: usize = 3;
const TASKS: usize = 4;
const ITERATIONS: usize = 25;

fn contend(store: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = format!("handoff-{}", fastrand::u32(..));
    leasehold_testkit::run_all(
        WORKER,
        &[
            "tasks",
            store,
            &key,
            &TASKS.to_string(),
            &ITERATIONS.to_string(),
            dir.path().to_str().expect("utf8"),
        ],
        PROCESSES,
        "two holders",
    );
    let text = std::fs::read_to_string(dir.path().join("fences")).expect("fences");
    let entries: Vec<(u64, u32)> = text
        .lines()
        .map(|l| {
            let (f, p) = l.split_once(' ').expect("fence pid");
            (f.parse().expect("fence"), p.parse().expect("pid"))
        })
        .collect();
    assert_eq!(entries.len(), PROCESSES * TASKS * ITERATIONS);
    for w in entries.windows(2) {
        assert!(
            w[1].0 > w[0].0,
            "fence {:?} entered after {:?} and is not above it",
            w[1],
            w[0]
        );
    }
    // The lease changed processes, and was handed on inside processes (runs longer than 1).
    let switches = entries.windows(2).filter(|w| w[0].1 != w[1].1).count();
    let handed = entries
        .windows(2)
        .filter(|w| w[0].1 == w[1].1 && w[1].0 == w[0].0 + 1)
        .count();
    eprintln!(
        "{store}: {switches} switches between processes, {handed} consecutive fences within one"
    );
    assert!(
        switches >= PROCESSES - 1,
        "the lease never changed processes"
    );
    assert!(handed > 0, "no local handoff happened");
}

#[test]
fn file_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    contend(&format!("file://{}", dir.path().display()));
}

#[test]
fn redis() {
    contend(&shared_redis().url());
}

#[test]
fn redlock() {
    contend(&redlock_url(&shared_redis_nodes()[..3]));
}

#[test]
fn redis_unix_socket() {
    contend(&shared_redis().unix_url());
}

#[test]
fn redis_sentinel() {
    contend(&leasehold_testkit::servers::shared_sentinels().url());
}

#[test]
fn redis_cluster() {
    contend(&leasehold_testkit::servers::shared_redis_cluster().url());
}

#[test]
fn redis_sentinel_with_replicas() {
    contend(&leasehold_testkit::servers::shared_sentinels().url_with("replicas=1"));
}

#[test]
fn redis_cluster_with_replicas() {
    contend(&format!(
        "{}?replicas=1",
        leasehold_testkit::servers::shared_redis_cluster().url()
    ));
}
