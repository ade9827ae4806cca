//! Semaphore and read-write permits beside a lock, on Redis and PostgreSQL, in one run each.
//!
//! `cargo bench -p leasehold-testkit --bench permits` (about a minute), `-- --quick` for a smoke
//! run, `-- redis` or `-- postgres` for one store.
//!
//! Acquire+release cycles per second over distinct keys with 1 and 8 tasks, through the lock API
//! (`Locks`, a guard with renewal, local layer off), each row the median of 3 interleaved rounds
//! of 2 s, each ratio the median of the per-round ratios:
//! * **lock**: `locks.lock(key)` (the mutex cycle the ratios are against);
//! * **permit**: `locks.semaphore(key, 4)`, one permit;
//! * **read**: `locks.read_write(key).read()`;
//! * **write**: `locks.read_write(key).write()`;
//! * on Redis, the **counting floor**: the cheapest semaphore a script can be, as Redisson's
//!   `RSemaphore` is: one script that decrements a counter if it is above zero, and one that
//!   increments it back (no holders, no expiry, no fence: not a usable lease, a lower bound).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{LockStore, Locks};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The counting floor's acquire: take one of `ARGV[1]` permits if one is left.
const COUNT_ACQUIRE: &str = r"
local left = redis.call('GET', KEYS[1])
if left == false then left = tonumber(ARGV[1]) else left = tonumber(left) end
if left <= 0 then return 0 end
redis.call('SET', KEYS[1], left - 1)
return 1";

/// The counting floor's release: give the permit back.
const COUNT_RELEASE: &str = "return redis.call('INCR', KEYS[1])";

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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Lock,
    Permit,
    Read,
    Write,
    CountingFloor,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Permit => "permit (semaphore of 4)",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::CountingFloor => "counting floor (Redisson-style script)",
        }
    }
}

/// One cycle of `kind` on the key of task `t`, round `round`.
async fn cycle(
    locks: &Locks,
    redis: Option<&redis::aio::MultiplexedConnection>,
    kind: Kind,
    key: String,
) {
    let guard = match kind {
        Kind::Lock => locks.lock(&key).unwrap(),
        Kind::Permit => locks.semaphore(&key, 4).unwrap(),
        Kind::Read => locks.read_write(&key).unwrap().read(),
        Kind::Write => locks.read_write(&key).unwrap().write(),
        Kind::CountingFloor => {
            let mut c = redis.expect("a Redis connection").clone();
            let got: i64 = redis::Script::new(COUNT_ACQUIRE)
                .key(&key)
                .arg(4)
                .invoke_async(&mut c)
                .await
                .unwrap();
            assert_eq!(got, 1, "counting floor: {key} has no permit left");
            let _: i64 = redis::Script::new(COUNT_RELEASE)
                .key(&key)
                .invoke_async(&mut c)
                .await
                .unwrap();
            return;
        }
    };
    let g = guard
        .try_acquire()
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{key} is not free"));
    g.release().await.unwrap();
}

async fn store_rows(
    label: &str,
    store: Arc<dyn LockStore>,
    redis: Option<redis::aio::MultiplexedConnection>,
    dur: Duration,
    rounds: usize,
) {
    let locks = Locks::from_arc(store).with_local_layer(false);
    let mut kinds = vec![Kind::Lock, Kind::Permit, Kind::Read, Kind::Write];
    if redis.is_some() {
        kinds.push(Kind::CountingFloor);
    }
    let redis = redis.map(Arc::new);
    for tasks in [1usize, 8] {
        let mut rates: Vec<Vec<f64>> = vec![vec![]; kinds.len()];
        for round in 0..rounds {
            for (i, &kind) in kinds.iter().enumerate() {
                let (locks, redis) = (locks.clone(), redis.clone());
                let tag = fastrand::u32(..);
                let r = rate(tasks, dur, move |t, n| {
                    let (locks, redis) = (locks.clone(), redis.clone());
                    // Distinct keys: one per task, changing every cycle (no record is reused
                    // while its last release may still be in flight).
                    let key = format!("bench-{tag:08x}-{round}-{t}-{n}");
                    async move { cycle(&locks, redis.as_deref(), kind, key).await }
                })
                .await;
                rates[i].push(r);
            }
        }
        for (i, kind) in kinds.iter().enumerate() {
            let per_round: Vec<f64> = (0..rounds).map(|r| rates[i][r] / rates[0][r]).collect();
            println!(
                "| {label} | {tasks} | {} | {:.0} | {:.2}× |",
                kind.name(),
                median(rates[i].clone()),
                median(per_round),
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = |name: &str| {
        let named: Vec<_> = args
            .iter()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        named.is_empty() || named.iter().any(|a| *a == name)
    };
    let dur = Duration::from_millis(if quick { 200 } else { 2000 });
    let rounds = if quick { 1 } else { 3 };
    println!("| store | tasks | cycle | cycles/s | vs lock |");
    println!("|---|---|---|---|---|");
    if only("redis") {
        let server = leasehold_testkit::servers::RedisServer::start();
        let store = leasehold::open_store(&server.url()).await.unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        store_rows("redis", store, Some(conn), dur, rounds).await;
    }
    if only("postgres") {
        let server = leasehold_testkit::servers::PostgresServer::start();
        let store = leasehold::open_store(&server.fresh_db()).await.unwrap();
        store_rows("postgres", store, None, dur, rounds).await;
    }
}
