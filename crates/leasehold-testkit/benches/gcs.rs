//! Google Cloud Storage benchmark against `fake-gcs-server` (started here on a free loopback
//! port): HTTP requests and cycles/s per acquisition, beside the floor measured in the same run.
//!
//! `cargo bench -p leasehold-testkit --bench gcs` (about 15 s), `-- --quick` for a smoke run.
//!
//! 1. Floor: the library's ([`leasehold::floor`]): one raw conditional create
//!    (`ifGenerationMatch=0`) + one conditional delete of a new object per cycle, through the
//!    store's own client.
//! 2. Uncontended acquire + release on new keys, one at a time (the target: ≤ 2 requests
//!    per cycle, ≥ 0.9× the floor's cycles/s).
//! 3. Uncontended acquire + release of one key again and again (the adapter's remembered version).
//! 4. Handoff: two clients (two holders, as two processes would be, local layer off) on one key,
//!    each acquiring and releasing at once, again: handoffs/s, requests per handoff.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::adapter::RecordLockStore;
use leasehold::stores::gcs::{GcsOptions, GcsStore};
use leasehold::{HolderId, Key, LeaseRecord, Locks, RecordStore};
use leasehold_testkit::gcs_server::{GcsServer, BUCKET};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

async fn store(server: &GcsServer, prefix: &str) -> Arc<GcsStore> {
    let mut o = GcsOptions::new(BUCKET);
    o.prefix = prefix.into();
    // The emulator itself: the test kit's proxy would add its own cost to every request.
    o.endpoint = Some(server.raw_url());
    Arc::new(GcsStore::connect(o).await.unwrap())
}

fn locks(store: &Arc<GcsStore>, holder: &str) -> Locks {
    Locks::new(RecordLockStore::new(store.clone()))
        .with_holder(HolderId::new(holder))
        .with_local_layer(false)
}

struct Figures {
    cycles_per_s: f64,
    requests: f64,
    p50: Duration,
    p99: Duration,
}

fn report(what: &str, n: usize, took: Duration, mut lat: Vec<Duration>, requests: u64) -> Figures {
    lat.sort();
    let f = Figures {
        cycles_per_s: n as f64 / took.as_secs_f64(),
        requests: requests as f64 / n as f64,
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
    };
    println!(
        "{what}: {n} cycles, {:.0} cycles/s, p50 {:?}, p99 {:?}, {:.2} requests per cycle",
        f.cycles_per_s, f.p50, f.p99, f.requests
    );
    f
}

async fn floor(server: &GcsServer, n: usize) -> Figures {
    let s = store(server, "bench-floor").await;
    let floor = s.floor().expect("the GCS store has a floor");
    let before = s.requests();
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for i in 0..n {
        let key = Key::new(format!("raw-{i}")).unwrap();
        let t = Instant::now();
        floor.cycle(&key).await.unwrap();
        lat.push(t.elapsed());
    }
    report(
        "floor (conditional create + conditional delete)",
        n,
        t0.elapsed(),
        lat,
        s.requests() - before,
    )
}

/// Where the time goes: a raw create + conditional replace on new keys (the requests an acquire +
/// release of a new key sends, leaving the same objects behind), and the adapter called directly
/// on new keys, without the guard; each on a fresh emulator.
async fn breakdown(n: usize) -> Figures {
    let server = &GcsServer::start();
    use leasehold::{AcquireOutcome, AcquireRequest, LockStore};
    let s = store(server, "bench-raw2").await;
    let before = s.requests();
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for i in 0..n {
        let key = Key::new(format!("raw-{i}")).unwrap();
        let t = Instant::now();
        let g = s
            .create(&key, &LeaseRecord::free(key.as_str(), 1))
            .await
            .unwrap();
        let r = s
            .replace(&key, &LeaseRecord::free(key.as_str(), 2), &g.unwrap())
            .await;
        assert!(r.unwrap().is_some());
        lat.push(t.elapsed());
    }
    let raw = report(
        "raw create + conditional replace, new keys",
        n,
        t0.elapsed(),
        lat,
        s.requests() - before,
    );
    let server = &GcsServer::start();
    let s = store(server, "bench-adapter").await;
    let a = RecordLockStore::new(s.clone());
    let before = s.requests();
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for i in 0..n {
        let key = Key::new(format!("a-{i}")).unwrap();
        let t = Instant::now();
        let req = AcquireRequest::new(key.clone(), "solo", Duration::from_secs(10));
        let AcquireOutcome::Granted(_) = a.acquire(&req).await.unwrap() else {
            panic!("free")
        };
        a.release(&key, &req.token).await.unwrap();
        lat.push(t.elapsed());
    }
    report(
        "the adapter alone (acquire + release), new keys",
        n,
        t0.elapsed(),
        lat,
        s.requests() - before,
    );
    raw
}

async fn uncontended(server: &GcsServer, n: usize, same_key: bool) -> Figures {
    let s = store(server, if same_key { "bench-same" } else { "bench-new" }).await;
    let l = locks(&s, "solo");
    let before = s.requests();
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for i in 0..n {
        let key = if same_key {
            "one".to_owned()
        } else {
            format!("solo-{i}")
        };
        let t = Instant::now();
        let g = l
            .lock(key)
            .unwrap()
            .ttl(Duration::from_secs(10))
            .try_acquire()
            .await
            .unwrap()
            .expect("free");
        g.release().await.unwrap();
        lat.push(t.elapsed());
    }
    report(
        if same_key {
            "uncontended acquire + release, one key again"
        } else {
            "uncontended acquire + release, new keys"
        },
        n,
        t0.elapsed(),
        lat,
        s.requests() - before,
    )
}

async fn handoff(server: &GcsServer, dur: Duration) {
    let (sa, sb) = (
        store(server, "bench-hot").await,
        store(server, "bench-hot").await,
    );
    let before = sa.requests() + sb.requests();
    let end = Instant::now() + dur;
    let mut tasks = vec![];
    for l in [locks(&sa, "a"), locks(&sb, "b")] {
        tasks.push(tokio::spawn(async move {
            let mut waits = vec![];
            while Instant::now() < end {
                let t = Instant::now();
                let g = l
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
    let mut waits = vec![];
    for t in tasks {
        waits.extend(t.await.unwrap());
    }
    let total = sa.requests() + sb.requests() - before;
    waits.sort();
    println!(
        "handoff (2 clients, one key): {} acquisitions in {dur:?} ({:.0}/s), wait p50 {:?} p99 {:?}, {:.2} requests per acquisition",
        waits.len(),
        waits.len() as f64 / dur.as_secs_f64(),
        pct(&waits, 0.5),
        pct(&waits, 0.99),
        total as f64 / waits.len().max(1) as f64,
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Each case on a fresh emulator: fake-gcs-server's writes slow down as its bucket fills, so
    // the cases would otherwise measure the order they ran in.
    rt.block_on(async {
        let n = if quick { 20 } else { 1000 };
        let f = floor(&GcsServer::start(), n).await;
        let same = uncontended(&GcsServer::start(), n, true).await;
        let f2 = floor(&GcsServer::start(), n).await;
        let u = uncontended(&GcsServer::start(), n, false).await;
        let f3 = floor(&GcsServer::start(), n).await;
        let raw = breakdown(n).await;
        let floor_rate = (f.cycles_per_s + f2.cycles_per_s + f3.cycles_per_s) / 3.0;
        println!(
            "ratio to the floor (cycles/s, floor the mean of its 3 runs, {floor_rate:.0}/s): one key {:.2}x, new keys {:.2}x; requests per cycle {:.2} and {:.2} (floor {:.2})",
            same.cycles_per_s / floor_rate,
            u.cycles_per_s / floor_rate,
            same.requests,
            u.requests,
            f.requests
        );
        println!(
            "new keys against raw create + conditional replace on new keys: {:.2}x",
            u.cycles_per_s / raw.cycles_per_s
        );
        handoff(
            &GcsServer::start(),
            if quick {
                Duration::from_secs(1)
            } else {
                Duration::from_secs(5)
            },
        )
        .await;
    });
}
