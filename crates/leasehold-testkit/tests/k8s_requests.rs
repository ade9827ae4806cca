//! API requests per acquisition on Kubernetes Leases, counted by leasehold-apiserver
//! (`/debug/requests`), and the dual layer: many tasks of one process contending on one key make
//! at most one API request in flight for that key at a time. Metrics use the `lock_…` names of the Kubernetes Lease pattern (`register_lock_names`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::servers::ApiServer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_request_in_flight_per_key_and_requests_per_acquisition() {
    let server = ApiServer::start();
    let registry = prometheus::Registry::new();
    let metrics = leasehold::Metrics::register_lock_names("llm", &registry).unwrap();
    let locks = leasehold::connect(&server.store_url("requests"))
        .await
        .unwrap()
        .with_metrics(metrics);

    // Uncontended acquire + release.
    server.reset_requests();
    let g = locks
        .lock("solo")
        .unwrap()
        .ttl(Duration::from_secs(2))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    let solo = server.requests();
    let first = solo["total"].as_u64().unwrap();
    eprintln!(
        "first acquire+release of a key: {first} API requests {}",
        solo["byVerb"]
    );
    // create (tried first for a key this process never wrote), one conditional update that
    // writes the fence the create's resourceVersion gave as a number (creates only), then one
    // conditional update (release keeps the fence in the Lease).
    assert_eq!(first, 3, "{solo}");
    server.reset_requests();
    let g = locks
        .lock("solo")
        .unwrap()
        .ttl(Duration::from_secs(2))
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    let again = server.requests();
    let per_cycle = again["total"].as_u64().unwrap();
    eprintln!(
        "next acquire+release: {per_cycle} API requests {}",
        again["byVerb"]
    );
    // Nobody wrote since our release: one conditional update to take it, one to release it.
    assert_eq!(per_cycle, 2, "{again}");

    // 20 tasks of this process contend on one key.
    server.reset_requests();
    const TASKS: u64 = 20;
    let inside = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let locks = locks.clone();
            let inside = inside.clone();
            tokio::spawn(async move {
                let g = locks
                    .lock("hot")
                    .unwrap()
                    .ttl(Duration::from_secs(2))
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let hot = server.requests();
    let total = hot["total"].as_u64().unwrap();
    eprintln!(
        "{TASKS} contending tasks: {total} API requests ({:.1} per acquisition) {}",
        total as f64 / TASKS as f64,
        hot["byVerb"]
    );
    assert_eq!(hot["maxInFlightPerLease"], 1, "{hot}");
    assert!(total <= TASKS * per_cycle + 1, "{hot}");

    let text = leasehold::Metrics::render(&registry);
    assert_eq!(metric(&text, "llm_lock_acquisition_attempts_total"), 22.0);
    assert_eq!(metric(&text, "llm_lock_acquisition_successes_total"), 22.0);
    assert_eq!(metric(&text, "llm_lock_releases_total"), 22.0);
    assert_eq!(
        metric(&text, "llm_lock_acquisition_duration_seconds_count"),
        22.0
    );
    assert_eq!(metric(&text, "llm_lock_hold_duration_seconds_count"), 22.0);
}
