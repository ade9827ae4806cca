//! Queue benchmarks on SQLite (a temp file) and PostgreSQL (a server the test kit starts).
//!
//! `cargo bench -p leasehold-testkit --bench queue` (about half a minute), `-- --quick` for a
//! smoke run.
//!
//! 1. Dispatch throughput with no-op tasks: 4 workers (each its own queue connection, as separate
//!    processes would be; 1 slot each, capacity 4) claim, take the key's lease from a `file://`
//!    store, record the fence, finish and release — tasks/s over 40 keys.
//! 2. Enqueue → start latency: one idle worker (its own connection) waits for work with
//!    `changed()`; tasks are enqueued one at a time after the previous one started; p50/p99 of
//!    the time from `enqueue` to `claim` returning the task. SQLite has no cross-connection
//!    notification (the worker polls every 50 ms); PostgreSQL wakes on `LISTEN/NOTIFY`.
//!
//! PostgreSQL twice: plain, and on a second server of the same settings that requires TLS
//! (`sslmode=verify-full`, the test kit's CA).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::queue::{open_queue, ClaimRequest, NewTask, Outcome, QueueBackend};
use leasehold::Locks;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn req(worker: &str, max: u32) -> ClaimRequest {
    ClaimRequest {
        worker: worker.into(),
        max_running: max,
        group_limit: None,
        ttl: Duration::from_secs(10),
    }
}

async fn throughput(url: &str, locks: &Locks, n: u64) -> f64 {
    let q = open_queue(url).await.unwrap();
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask::new(format!("k{}", i % 40), "{\"argv\":[\"true\"]}"))
        .collect();
    q.enqueue_batch(&tasks).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = vec![];
    for w in 0..4 {
        let (url, locks, done) = (url.to_owned(), locks.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            let q = open_queue(&url).await.unwrap();
            let me = format!("bench-{w}");
            while done.load(Ordering::Relaxed) < n {
                let Some(t) = q.claim(&req(&me, 4)).await.unwrap() else {
                    q.changed(Duration::from_millis(5)).await;
                    continue;
                };
                let g = locks
                    .lock(&t.key)
                    .unwrap()
                    .ttl(Duration::from_secs(10))
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                assert!(q.started(t.id, &me, g.fence()).await.unwrap());
                assert!(q.finish(t.id, &me, &Outcome::Succeeded).await.unwrap());
                g.release().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}

async fn latency(url: &str, n: usize) -> (Duration, Duration) {
    let q = open_queue(url).await.unwrap();
    let worker: Arc<dyn QueueBackend> = open_queue(url).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let w = tokio::spawn(async move {
        let mut got = 0;
        while got < n {
            match worker.claim(&req("lat", 4)).await.unwrap() {
                Some(t) => {
                    tx.send(Instant::now()).unwrap();
                    worker
                        .finish(t.id, "lat", &Outcome::Succeeded)
                        .await
                        .unwrap();
                    got += 1;
                }
                None => worker.changed(Duration::from_millis(50)).await,
            }
        }
    });
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        // Let the worker go idle (waiting in changed()) before the next task comes.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(5..20))).await;
        let t0 = Instant::now();
        q.enqueue(&NewTask::new(format!("lat{i}"), "{\"argv\":[\"true\"]}"))
            .await
            .unwrap();
        let t1 = rx.recv().await.unwrap();
        samples.push(t1 - t0);
    }
    w.await.unwrap();
    samples.sort_unstable();
    (samples[n / 2], samples[(n * 99 / 100).min(n - 1)])
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, lat_n) = if quick { (200, 20) } else { (2000, 200) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("locks").display());
    let pg = leasehold_testkit::servers::shared_postgres();
    let pg_tls = leasehold_testkit::servers::shared_postgres_tls();
    rt.block_on(async {
        let locks = leasehold::connect(&store).await.unwrap();
        println!("queue benchmark ({n} no-op tasks, 4 slots, 40 keys; latency over {lat_n} tasks)");
        println!(
            "{:<10} {:>12} {:>14} {:>14}",
            "backend", "tasks/s", "enq→start p50", "p99"
        );
        for (name, tput_url, lat_url) in [
            (
                "sqlite",
                format!("sqlite://{}", dir.path().join("t.db").display()),
                format!("sqlite://{}", dir.path().join("l.db").display()),
            ),
            ("postgres", pg.fresh_db(), pg.fresh_db()),
            // The same server's settings, over TLS (sslmode=verify-full).
            ("pg+tls", pg_tls.fresh_db(), pg_tls.fresh_db()),
        ] {
            let tput = throughput(&tput_url, &locks, n).await;
            let (p50, p99) = latency(&lat_url, lat_n).await;
            println!(
                "{name:<10} {tput:>12.0} {:>14} {:>14}",
                format!("{:.2} ms", p50.as_secs_f64() * 1e3),
                format!("{:.2} ms", p99.as_secs_f64() * 1e3)
            );
        }
    });
}
