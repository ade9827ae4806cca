//! Object-store benchmark against moto (S3) and Azurite (Azure Blob), both started here on free
//! loopback ports: requests and latency per acquisition, beside the floor measured in the same
//! run.
//!
//! `cargo bench -p leasehold-testkit --bench object_stores` (about 1 minute), `-- --quick` for a
//! smoke run.
//!
//! 1. Floor: the library's ([`leasehold::floor`]): one raw conditional create
//!    (`If-None-Match: *`) and one conditional delete (`If-Match`) of an object, through the
//!    store's own client, one at a time: cycles/s.
//! 2. Uncontended acquire + release of one key, one at a time: cycles/s (and its ratio to the
//!    floor; the target is ≥ 0.9), p50/p99 latency, and requests per cycle (every record-store
//!    call is one HTTP request; counted by a wrapper; the target is ≤ 2).
//! 3. Contended handoff: 4 tasks in each of two clients (two processes' worth) on one key,
//!    acquire and release at once, again: handoffs/s, p50/p99 wait and requests per handoff.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_trait::async_trait;
use leasehold::adapter::RecordLockStore;
use leasehold::stores::object::Precondition;
use leasehold::{Capabilities, Key, LeaseRecord, Locks, RecordStore, Result, Stored};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A record store that counts the calls (each one HTTP request) it passes on.
#[derive(Debug)]
struct Counted<R> {
    inner: R,
    calls: Arc<AtomicU64>,
}

impl<R> Counted<R> {
    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<R: RecordStore> RecordStore for Counted<R> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn get(&self, key: &Key) -> Result<Option<Stored>> {
        self.tick();
        self.inner.get(key).await
    }
    async fn create(&self, key: &Key, record: &LeaseRecord) -> Result<Option<String>> {
        self.tick();
        self.inner.create(key, record).await
    }
    async fn replace(&self, key: &Key, r: &LeaseRecord, version: &str) -> Result<Option<String>> {
        self.tick();
        self.inner.replace(key, r, version).await
    }
    async fn delete(&self, key: &Key, version: &str) -> Result<bool> {
        self.tick();
        self.inner.delete(key, version).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>> {
        self.tick();
        self.inner.list(prefix).await
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Runs `cycle` `n` times, one at a time: cycles/s and the sorted latencies.
async fn timed<F: Future<Output = ()>>(
    n: usize,
    mut cycle: impl FnMut(usize) -> F,
) -> (f64, Vec<Duration>) {
    let start = Instant::now();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        cycle(i).await;
        lat.push(t.elapsed());
    }
    lat.sort();
    (n as f64 / start.elapsed().as_secs_f64(), lat)
}

/// One cycle of a raw operation per call (the floor, the overwrites), as a boxed future.
type Floor = Arc<dyn Fn(usize) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The store's own floor ([`leasehold::floor`]): a raw conditional create + delete per cycle.
fn library_floor(store: &impl RecordStore) -> Floor {
    let floor = store.floor().expect("the object stores have a floor");
    Arc::new(move |i| {
        let floor = floor.clone();
        Box::pin(async move {
            let key = Key::new(format!("floor-{i}")).unwrap();
            floor.cycle(&key).await.unwrap();
        })
    })
}

async fn bench<R: RecordStore>(
    what: &str,
    floor: Floor,
    overwrite: Floor,
    make: impl Fn() -> R,
    n: usize,
    dur: Duration,
) {
    // Warm up the connection pools.
    floor(usize::MAX).await;
    let (floor_rate, floor_lat) = timed(n, |i| floor(i)).await;
    let (over_rate, over_lat) = timed(n, |i| overwrite(i)).await;
    let calls = Arc::new(AtomicU64::new(0));
    let locks = Locks::new(RecordLockStore::new(Counted {
        inner: make(),
        calls: calls.clone(),
    }));
    let cycle = |_| {
        let locks = locks.clone();
        async move {
            let g = locks
                .lock("solo")
                .unwrap()
                .ttl(Duration::from_secs(10))
                .try_acquire()
                .await
                .unwrap()
                .expect("free");
            g.release().await.unwrap();
        }
    };
    cycle(0).await; // the record exists from here on
    calls.store(0, Ordering::Relaxed);
    let (rate, lat) = timed(n, cycle).await;
    let per_cycle = calls.load(Ordering::Relaxed) as f64 / n as f64;
    println!(
        "{what} floor (raw conditional create + conditional delete): {floor_rate:.0} cycles/s, p50 {:?}",
        pct(&floor_lat, 0.5)
    );
    println!(
        "{what} two raw conditional overwrites (If-Match) of one object: {over_rate:.0} cycles/s, p50 {:?}",
        pct(&over_lat, 0.5)
    );
    println!(
        "{what} uncontended acquire+release: {rate:.0} cycles/s = {:.2}x the floor ({:.2}x the overwrites), p50 {:?}, p99 {:?}, {per_cycle:.2} requests per cycle",
        rate / floor_rate,
        rate / over_rate,
        pct(&lat, 0.5),
        pct(&lat, 0.99)
    );

    let calls = Arc::new(AtomicU64::new(0));
    let clients: Vec<Locks> = (0..2)
        .map(|_| {
            Locks::new(RecordLockStore::new(Counted {
                inner: make(),
                calls: calls.clone(),
            }))
        })
        .collect();
    let end = Instant::now() + dur;
    let mut tasks = vec![];
    for locks in clients {
        for _ in 0..4 {
            let locks = locks.clone();
            tasks.push(tokio::spawn(async move {
                let mut waits = vec![];
                while Instant::now() < end {
                    let t = Instant::now();
                    let g = locks
                        .lock("hot")
                        .unwrap()
                        .ttl(Duration::from_secs(10))
                        .wait(Duration::from_secs(60))
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
    waits.sort();
    println!(
        "{what} contended handoff (2 clients x 4 tasks, one key): {} handoffs in {dur:?} ({:.0}/s), wait p50 {:?} p99 {:?}, {:.2} requests per handoff",
        waits.len(),
        waits.len() as f64 / dur.as_secs_f64(),
        pct(&waits, 0.5),
        pct(&waits, 0.99),
        calls.load(Ordering::Relaxed) as f64 / waits.len().max(1) as f64,
    );
}

/// The raw writes of both stores.
trait Raw: Send + Sync {
    fn put(
        &self,
        body: Vec<u8>,
        p: Precondition<'_>,
    ) -> impl Future<Output = Option<String>> + Send;
}

impl Raw for leasehold::stores::s3::S3Store {
    async fn put(&self, body: Vec<u8>, p: Precondition<'_>) -> Option<String> {
        self.raw_put("overwrite.json", body, p).await.unwrap().etag
    }
}

impl Raw for leasehold::stores::azure::AzureStore {
    async fn put(&self, body: Vec<u8>, p: Precondition<'_>) -> Option<String> {
        self.raw_put("overwrite.json", body, p).await.unwrap().etag
    }
}

/// Two conditional overwrites of one object (what a cycle of leasehold sends: one to take the
/// lease, one to free it), the object created first if need be.
async fn overwrite_twice(raw: &impl Raw, last: &std::sync::Mutex<Option<String>>) {
    let mut etag = last.lock().unwrap().take();
    if etag.is_none() {
        etag = raw.put(b"{}".to_vec(), Precondition::Absent).await;
    }
    for i in 0..2 {
        let body = format!("{{\"n\": {i}, \"r\": {}}}", fastrand::u64(..)).into_bytes();
        let current = etag.clone().expect("an ETag");
        etag = Some(
            raw.put(body, Precondition::Matches(&current))
                .await
                .expect("overwritten"),
        );
    }
    *last.lock().unwrap() = etag;
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, dur) = if quick {
        (20, Duration::from_secs(1))
    } else {
        (300, Duration::from_secs(10))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let moto = leasehold_testkit::s3_server::MotoServer::start();
    let floor = library_floor(&moto.store("bench", "floor"));
    let raw = Arc::new(moto.store("bench", "overwrite"));
    let last = Arc::new(std::sync::Mutex::new(None));
    let overwrite: Floor = Arc::new(move |_| {
        let (raw, last) = (raw.clone(), last.clone());
        Box::pin(async move { overwrite_twice(&*raw, &last).await })
    });
    rt.block_on(bench(
        "s3 (moto)",
        floor,
        overwrite,
        || moto.store("bench", "locks"),
        n,
        dur,
    ));
    drop(moto);

    let azurite = leasehold_testkit::azure_server::AzuriteServer::start();
    let floor = library_floor(&rt.block_on(azurite.store("bench", "floor")));
    let raw = Arc::new(rt.block_on(azurite.store("bench", "overwrite")));
    let last = Arc::new(std::sync::Mutex::new(None));
    let overwrite: Floor = Arc::new(move |_| {
        let (raw, last) = (raw.clone(), last.clone());
        Box::pin(async move { overwrite_twice(&*raw, &last).await })
    });
    rt.block_on(bench(
        "azure (Azurite)",
        floor,
        overwrite,
        || {
            let mut o = leasehold::stores::azure::AzureOptions::new("bench");
            o.prefix = "locks".into();
            o.endpoint = Some(azurite.endpoint());
            o.credentials = Some(leasehold::stores::azure::AzureCredentials::new(
                leasehold::stores::azure::DEV_ACCOUNT.0,
                leasehold::stores::azure::DEV_ACCOUNT.1,
            ));
            leasehold::stores::azure::AzureStore::connect(o).unwrap()
        },
        n,
        dur,
    ));
}
