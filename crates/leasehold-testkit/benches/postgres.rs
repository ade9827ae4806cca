//! PostgreSQL lock store benchmarks against the floors, in one run on one server the test kit
//! starts.
//!
//! `cargo bench -p leasehold-testkit --bench postgres` (about a minute), `-- --quick` for a smoke
//! run.
//!
//! 1. Acquire+release cycles per second over distinct keys with 1 / 8 / 64 tasks sharing one
//!    connection (pipelined), each row the median of 3 interleaved rounds. Floors, through the
//!    same driver on one connection (as the store has), prepared: the **fenced floor**, the
//!    library's ([`leasehold::floor`]: on the store's own connection and table, the cheapest pair
//!    of statements that also fences, writes the row's operator-visible columns and judges
//!    expiry on the server's clock — an `INSERT … ON CONFLICT (key) DO UPDATE … WHERE` free or
//!    expired, taking `nextval`, `RETURNING` the fence; then an `UPDATE` that frees the row and
//!    keeps it), which the ratios are against; and as context the plain upsert + delete (`INSERT … ON CONFLICT DO NOTHING`
//!    of a row, `DELETE … WHERE key AND token`) and the raw `pg_try_advisory_lock` +
//!    `pg_advisory_unlock`. Measured: the store's own calls (`LockStore::acquire` + `release`),
//!    and the lock API (`Locks`, a guard with renewal, local layer off).
//! 2. A hot key's handoff: two stores (two connections, as two processes), one holds the key and
//!    the other waits for it in `acquire`; the time from the holder's release to the waiter's
//!    grant, p50 and p99 over 300 handoffs.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{AcquireRequest, Key, LockStore, Locks};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `op(task, i)` in `tasks` tasks for `dur`: operations per second.
async fn rate<F, Fut>(tasks: usize, dur: Duration, op: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (op, stop, done) = (op.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    op(t, i).await;
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn client(url: &str) -> Arc<tokio_postgres::Client> {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    Arc::new(c)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = Duration::from_millis(if quick { 200 } else { 2000 });
    let rounds = if quick { 1 } else { 3 };
    let server = leasehold_testkit::servers::PostgresServer::start();
    let url = server.fresh_db();
    let raw = client(&url).await;
    raw.batch_execute(
        "CREATE TABLE raw (key TEXT PRIMARY KEY, token TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL)",
    )
    .await
    .unwrap();
    let upsert = raw
        .prepare(
            "INSERT INTO raw (key, token, expires) VALUES ($1, $2, now() + interval '10 s') \
             ON CONFLICT DO NOTHING",
        )
        .await
        .unwrap();
    let delete = raw
        .prepare("DELETE FROM raw WHERE key = $1 AND token = $2")
        .await
        .unwrap();
    let try_lock = raw
        .prepare("SELECT pg_try_advisory_lock($1)")
        .await
        .unwrap();
    let unlock = raw.prepare("SELECT pg_advisory_unlock($1)").await.unwrap();
    let store: Arc<dyn LockStore> = leasehold::open_store(&url).await.unwrap();
    let floor = store.floor().expect("the PostgreSQL store has a floor");
    let locks = Locks::from_arc(store.clone()).with_local_layer(false);
    let ttl = Duration::from_secs(10);
    println!("PostgreSQL lock store: acquire+release cycles/s, {rounds} round(s) of {dur:?}");
    println!(
        "| tasks | fenced floor | upsert+delete | advisory lock+unlock | store calls | ratio | Locks | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for tasks in [1usize, 8, 64] {
        let mut rows: [Vec<f64>; 5] = Default::default();
        for round in 0..rounds {
            let f = floor.clone();
            rows[4].push(
                rate(tasks, dur, move |t, i| {
                    let f = f.clone();
                    async move {
                        let key = Key::new(format!("floor/{round}/{t}/{i}")).unwrap();
                        f.cycle(&key).await.unwrap();
                    }
                })
                .await,
            );
            let (c, u, d) = (raw.clone(), upsert.clone(), delete.clone());
            rows[0].push(
                rate(tasks, dur, move |t, i| {
                    let (c, u, d) = (c.clone(), u.clone(), d.clone());
                    async move {
                        let key = format!("raw/{round}/{t}/{i}");
                        let token = format!("{t}-{i}");
                        assert_eq!(c.execute(&u, &[&key, &token]).await.unwrap(), 1);
                        assert_eq!(c.execute(&d, &[&key, &token]).await.unwrap(), 1);
                    }
                })
                .await,
            );
            let (c, l, un) = (raw.clone(), try_lock.clone(), unlock.clone());
            rows[1].push(
                rate(tasks, dur, move |t, i| {
                    let (c, l, un) = (c.clone(), l.clone(), un.clone());
                    async move {
                        let id = (t as i64) << 40 | i as i64;
                        let got: bool = c.query_one(&l, &[&id]).await.unwrap().get(0);
                        assert!(got);
                        let freed: bool = c.query_one(&un, &[&id]).await.unwrap().get(0);
                        assert!(freed);
                    }
                })
                .await,
            );
            let s = store.clone();
            rows[2].push(
                rate(tasks, dur, move |t, i| {
                    let s = s.clone();
                    async move {
                        let key = Key::new(format!("store/{round}/{t}/{i}")).unwrap();
                        let req = AcquireRequest::new(key.clone(), "bench", ttl);
                        s.acquire(&req).await.unwrap();
                        s.release(&key, &req.token).await.unwrap();
                    }
                })
                .await,
            );
            let l = locks.clone();
            rows[3].push(
                rate(tasks, dur, move |t, i| {
                    let l = l.clone();
                    async move {
                        let g = l
                            .lock(format!("locks/{round}/{t}/{i}"))
                            .unwrap()
                            .ttl(ttl)
                            .try_acquire()
                            .await
                            .unwrap()
                            .unwrap();
                        g.release().await.unwrap();
                    }
                })
                .await,
            );
        }
        let [plain, adv, calls, api, floor] = rows.map(median);
        println!(
            "| {tasks} | {floor:.0} | {plain:.0} | {adv:.0} | {calls:.0} | {:.2}× | {api:.0} | {:.2}× |",
            calls / floor,
            api / floor
        );
    }
    handoff(&url, if quick { 30 } else { 300 }).await;
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!("load average at the end (1, 5, 15 min): {}", load.trim());
    }
}

/// A hot key handed back and forth between two stores (two connections).
async fn handoff(url: &str, n: usize) {
    let a = Locks::from_arc(leasehold::open_store(url).await.unwrap()).with_local_layer(false);
    let b = Locks::from_arc(leasehold::open_store(url).await.unwrap()).with_local_layer(false);
    let ttl = Duration::from_secs(10);
    let mut times = Vec::with_capacity(n);
    let mut held = a.lock("hot").unwrap().ttl(ttl).acquire().await.unwrap();
    for i in 0..n {
        let next = if i % 2 == 0 { b.clone() } else { a.clone() };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(async move {
            let g = next
                .lock("hot")
                .unwrap()
                .ttl(ttl)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            let _ = tx.send(Instant::now());
            g
        });
        // Let the waiter find the key held and wait for its release.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let granted = rx.await.unwrap();
        times.push(granted.saturating_duration_since(released));
        held = waiter.await.unwrap();
    }
    held.release().await.unwrap();
    times.sort();
    let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!(
        "\nhot-key handoff between two connections ({n}): p50 {:?}, p99 {:?}",
        p(0.5),
        p(0.99)
    );
}
