//! etcd benchmark, each row beside its floors in the same run, against one etcd member started
//! here on free loopback ports.
//!
//! `cargo bench -p leasehold-testkit --bench etcd` (about a minute), `-- --quick` for a smoke run.
//!
//! 1. Acquire+release cycles/s with 1, 8 and 64 concurrent tasks over distinct keys: (a) the raw
//!    floor — the library's ([`leasehold::floor`]: a transaction creating the key if its create
//!    revision is 0, attached to a lease, then a delete, through the store's own client); (b) etcd's own `Lock`/`Unlock` RPCs (also
//!    attached to one lease); (c) leasehold `etcd://`. Each row gives its ratio to both floors.
//! 2. A hot key: 8 tasks in each of two clients (two processes' worth of sessions) contending on
//!    one key, acquire and release at once, again: handoffs/s and the handoff time — from a
//!    holder's release to the next holder's grant — p50/p99; beside etcd's own `Lock`/`Unlock`
//!    on one key with the same tasks.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use etcd_client::{Client, LockOptions};
use leasehold_testkit::etcd_cluster::store_url;
use leasehold_testkit::servers::EtcdServer;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(10);

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    RawTxn,
    LockRpc,
    Leasehold,
}

/// Acquire+release cycles per second with `tasks` tasks, each on its own keys, for `dur`.
async fn throughput(server: &EtcdServer, who: Who, tasks: usize, dur: Duration) -> f64 {
    let client = Client::connect([server.url()], None).await.unwrap();
    let lease = client
        .lease_client()
        .grant(TTL.as_secs() as i64, None)
        .await
        .unwrap()
        .id();
    let locks = leasehold::connect(&format!("{}?prefix=bench/", store_url(server)))
        .await
        .unwrap();
    let floor = leasehold::open_store(&format!("{}?prefix=bench/", store_url(server)))
        .await
        .unwrap()
        .floor()
        .expect("the etcd store has a floor");
    let run = fastrand::u32(..);
    let end = Instant::now() + dur;
    let mut handles = vec![];
    for t in 0..tasks {
        let (mut c, locks, floor) = (client.clone(), locks.clone(), floor.clone());
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                let key = format!("bench-{run}/{t}/{n}");
                match who {
                    Who::RawTxn => {
                        floor
                            .cycle(&leasehold::Key::new(key).unwrap())
                            .await
                            .unwrap();
                    }
                    Who::LockRpc => {
                        let got = c
                            .lock(key, Some(LockOptions::new().with_lease(lease)))
                            .await
                            .unwrap();
                        c.unlock(got.key()).await.unwrap();
                    }
                    Who::Leasehold => {
                        let g = locks
                            .lock(&key)
                            .unwrap()
                            .ttl(TTL)
                            .try_acquire()
                            .await
                            .unwrap()
                            .expect("free");
                        g.release().await.unwrap();
                    }
                }
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / dur.as_secs_f64()
}

/// Handoffs on one key by 8 tasks in each of two clients for `dur`: (handoffs, handoff times).
async fn hot_key(server: &EtcdServer, rpc: bool, dur: Duration) -> (usize, Vec<Duration>) {
    let name = format!("hot-{}", fastrand::u32(..));
    // The last release's time; a grant measures its handoff from it.
    let released: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handoffs: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let end = Instant::now() + dur;
    let mut handles = vec![];
    for c in 0..2 {
        let client = Client::connect([server.url()], None).await.unwrap();
        let lease = client
            .lease_client()
            .grant(TTL.as_secs() as i64, None)
            .await
            .unwrap()
            .id();
        let locks = leasehold_testkit::connect_as(
            &format!("{}?prefix=bench/", store_url(server)),
            &format!("client-{c}"),
        )
        .await;
        for _ in 0..8 {
            let (mut client, locks, name) = (client.clone(), locks.clone(), name.clone());
            let (released, handoffs) = (released.clone(), handoffs.clone());
            handles.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let grant = |released: &Mutex<Option<Instant>>| {
                        if let Some(r) = released.lock().unwrap().take() {
                            handoffs.lock().unwrap().push(r.elapsed());
                        }
                    };
                    if rpc {
                        let got = client
                            .lock(name.as_str(), Some(LockOptions::new().with_lease(lease)))
                            .await
                            .unwrap();
                        grant(&released);
                        *released.lock().unwrap() = Some(Instant::now());
                        client.unlock(got.key()).await.unwrap();
                    } else {
                        let g = locks
                            .lock(&name)
                            .unwrap()
                            .ttl(TTL)
                            .wait(Duration::from_secs(60))
                            .acquire()
                            .await
                            .unwrap();
                        grant(&released);
                        *released.lock().unwrap() = Some(Instant::now());
                        g.release().await.unwrap();
                    }
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut times = handoffs.lock().unwrap().clone();
    times.sort();
    (times.len(), times)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = Duration::from_millis(if quick { 300 } else { 3000 });
    let server = EtcdServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("acquire+release cycles/s over distinct keys ({dur:?} each):");
        for tasks in [1, 8, 64] {
            let raw = throughput(&server, Who::RawTxn, tasks, dur).await;
            let rpc = throughput(&server, Who::LockRpc, tasks, dur).await;
            let ours = throughput(&server, Who::Leasehold, tasks, dur).await;
            println!(
                "  {tasks:>2} tasks: raw txn+delete {raw:.0}/s, Lock/Unlock RPC {rpc:.0}/s, leasehold {ours:.0}/s = {:.2}x raw txn, {:.2}x Lock RPC",
                ours / raw,
                ours / rpc
            );
        }
        let hot = dur * 2;
        for (label, rpc) in [("etcd Lock/Unlock RPC", true), ("leasehold", false)] {
            let (n, times) = hot_key(&server, rpc, hot).await;
            println!(
                "hot key, 2 clients x 8 tasks, {label}: {n} handoffs in {hot:?} ({:.0}/s), handoff p50 {:?} p99 {:?}",
                n as f64 / hot.as_secs_f64(),
                pct(&times, 0.5),
                pct(&times, 0.99)
            );
        }
    });
}
