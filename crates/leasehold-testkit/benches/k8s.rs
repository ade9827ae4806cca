//! Kubernetes Lease benchmark against leasehold-apiserver over a real etcd (both started here on
//! free loopback ports): API requests and latency per acquisition.
//!
//! `cargo bench -p leasehold-testkit --bench k8s` (about 20 s), `-- --quick` for a smoke run.
//!
//! 1. Uncontended acquire + release on distinct keys, one at a time: p50/p99 latency and API
//!    requests per cycle (counted by the server's `/debug/requests`; the target is 2).
//! 2. Contended handoff: 8 tasks in each of two clients (two holders, as two pods would be) on one
//!    key, acquire and release at once, again: handoffs/s, p50/p99 wait, requests per handoff, and
//!    the most requests ever in flight for the key.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::ApiServer;
use std::time::{Duration, Instant};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

async fn uncontended(server: &ApiServer, n: usize) {
    let locks = leasehold::connect(&server.store_url("bench"))
        .await
        .unwrap();
    server.reset_requests();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let g = locks
            .lock(format!("solo-{i}"))
            .unwrap()
            .ttl(Duration::from_secs(10))
            .try_acquire()
            .await
            .unwrap()
            .expect("free");
        g.release().await.unwrap();
        lat.push(t.elapsed());
    }
    let total = server.requests()["total"].as_u64().unwrap();
    lat.sort();
    println!(
        "uncontended acquire+release: {n} cycles, p50 {:?}, p99 {:?}, {:.2} API requests per cycle",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        total as f64 / n as f64
    );
}

async fn contended(server: &ApiServer, dur: Duration) {
    let a = leasehold_testkit::connect_as(&server.store_url("bench"), "pod-a")
        .await
        .with_local_layer(true);
    let b = leasehold_testkit::connect_as(&server.store_url("bench"), "pod-b")
        .await
        .with_local_layer(true);
    server.reset_requests();
    let end = Instant::now() + dur;
    let mut tasks = vec![];
    for locks in [a, b] {
        for _ in 0..8 {
            let locks = locks.clone();
            tasks.push(tokio::spawn(async move {
                let mut waits = vec![];
                while Instant::now() < end {
                    let t = Instant::now();
                    let g = locks
                        .lock("hot")
                        .unwrap()
                        .ttl(Duration::from_secs(10))
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .await
                        .unwrap();
                    waits.push(t.elapsed());
                    g.release().await.unwrap();
                }
                waits
            }));
        }
    }
    let mut waits = vec![];
    for t in tasks {
        waits.extend(t.await.unwrap());
    }
    let counts = server.requests();
    let total = counts["total"].as_u64().unwrap();
    waits.sort();
    println!(
        "contended handoff (2 clients x 8 tasks, one key): {} handoffs in {dur:?} ({:.0}/s), wait p50 {:?} p99 {:?}, {:.2} API requests per handoff, at most {} in flight for the key",
        waits.len(),
        waits.len() as f64 / dur.as_secs_f64(),
        pct(&waits, 0.5),
        pct(&waits, 0.99),
        total as f64 / waits.len().max(1) as f64,
        counts["maxInFlightPerLease"]
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let server = ApiServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        uncontended(&server, if quick { 20 } else { 500 }).await;
        contended(
            &server,
            if quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(10)
            },
        )
        .await;
    });
}
