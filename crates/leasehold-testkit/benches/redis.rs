//! Redis and Redlock benchmarks, each beside its floor and the `rslock` crate in the same run.
//!
//! `cargo bench -p leasehold-testkit --bench redis` (about four minutes: every throughput row is
//! the median of 3 interleaved runs, `-- rounds=N` to change), `-- --quick` for a smoke run.
//! Starts its own `redis-server`s (1 + 3) on free loopback ports; `-- unix` runs the one-node rows
//! through the server's Unix socket instead, and `-- cluster` on a Redis Cluster (three primaries
//! with a replica each; the floors through the redis crate's cluster client, keys hash-tagged,
//! no `rslock`, which has no cluster mode), and `-- replicas` on one server with a replica:
//! leasehold with `?replicas=1` beside the floor and the WAIT floor (`SET NX PX` + `WAIT 1` in one
//! round trip; [`FloorAcquire::SetWait`]).
//!
//! 1. Acquire+release cycles/s and p50/p99 latency with 1, 8 and 64 concurrent tasks over distinct
//!    keys: (a) the floor — `SET NX PX` + a compare-and-delete script through the same client;
//!    (a') the fenced floor — the library's ([`leasehold::floor`]: one script doing `INCR` +
//!    `SET NX PX`, a compare-and-delete script, through the store's own connection; on 3 nodes
//!    the same on each, a majority granting);
//!    (a'') with `-- only=multi-floor`, a fence with plain commands (`MULTI` `INCR` + `SET NX PX`
//!    `EXEC`, one round trip; [`FloorAcquire::Multi`]);
//!    (b) leasehold `redis://`; (c) `rslock` 0.10; and on 3 nodes: the raw 3-node quorum floor,
//!    leasehold `redlock://`, `rslock` with 3 nodes.
//!    Each row gives its ratio to the floor and to the fenced floor: the median of the per-round
//!    ratios (each against the same round's run), with their range.
//! 2. A hot key: 8 and 64 tasks split over 2 OS processes contending on one key (acquire, release at
//!    once, again): handoffs/s, p50/p99/p99.9 wait, and the longest wait of any acquisition.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::Locks;
use leasehold_testkit::servers::{redlock_url, RedisCluster, RedisServer};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "LEASEHOLD_REDIS_BENCH_CHILD";
const TTL: Duration = Duration::from_secs(10);

const CAD: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// How a floor acquires.
#[derive(Clone)]
enum FloorAcquire {
    /// `SET NX PX` (the floor).
    Set,
    /// `MULTI` `INCR` + `SET NX PX` `EXEC` in one round trip: a fence with plain commands (not in
    /// the record, a failed attempt burns one). Only with `-- only=multi-floor`.
    Multi,
    /// `SET NX PX` then `WAIT 1` in one round trip: the floor of an acquisition a replica
    /// acknowledges. With `-- replicas`.
    SetWait,
}

/// The floor's acquire: `SET key token NX PX ttl`.
fn set_nx(key: &str, token: &str) -> redis::Cmd {
    let mut set = redis::cmd("SET");
    set.arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(TTL.as_millis() as u64);
    set
}

/// A floor's connection: to one server, or to a cluster.
#[derive(Clone)]
enum FloorConn {
    One(redis::aio::ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for FloorConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            FloorConn::One(c) => c.req_packed_command(cmd),
            FloorConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            FloorConn::One(c) => c.req_packed_commands(cmd, offset, count),
            FloorConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[derive(Clone)]
enum Impl {
    /// A floor: acquire as [`FloorAcquire`] says, release with the compare-and-delete script.
    Floor(Vec<FloorConn>, Arc<redis::Script>, FloorAcquire),
    /// The store's own floor ([`leasehold::floor`]): the fenced floor.
    Library(Arc<dyn leasehold::floor::Floor>),
    Leasehold(Locks),
    /// The store calls alone, without the guard (its renewal task) and the local layer.
    Raw(Arc<dyn leasehold::LockStore>),
    Rslock(Arc<rslock::LockManager>),
}

impl Impl {
    async fn cycle(&self, key: &str) {
        match self {
            Impl::Floor(conns, cad, acquire) => {
                // Hash-tagged, so that the multi floor's two keys share a slot on a cluster.
                let key = &format!("{{{key}}}");
                let token = format!("{:x}", fastrand::u128(..));
                let sets = conns.iter().map(|c| {
                    let mut c = c.clone();
                    let (key, token, acquire) = (key.to_owned(), token.clone(), acquire.clone());
                    async move {
                        match acquire {
                            FloorAcquire::Set => {
                                let r: Option<String> =
                                    set_nx(&key, &token).query_async(&mut c).await.unwrap();
                                r.map(|_| token)
                            }
                            FloorAcquire::SetWait => {
                                let (set, _acked): (Option<String>, i64) = redis::pipe()
                                    .add_command(set_nx(&key, &token))
                                    .cmd("WAIT")
                                    .arg(1)
                                    .arg(1000)
                                    .query_async(&mut c)
                                    .await
                                    .unwrap();
                                set.map(|_| token)
                            }
                            FloorAcquire::Multi => {
                                let (_fence, set): (i64, Option<String>) = redis::pipe()
                                    .atomic()
                                    .cmd("INCR")
                                    .arg(format!("{key}:fence"))
                                    .add_command(set_nx(&key, &token))
                                    .query_async(&mut c)
                                    .await
                                    .unwrap();
                                set.map(|_| token)
                            }
                        }
                    }
                });
                let values = join(sets).await;
                let granted = values.iter().filter(|g| g.is_some()).count();
                assert!(granted > conns.len() / 2, "floor: key {key} not free");
                let dels = conns.iter().zip(values).map(|(c, value)| {
                    let mut c = c.clone();
                    let cad = cad.clone();
                    let (key, token) = (key.to_owned(), value.unwrap_or_default());
                    async move {
                        let _: i64 = cad
                            .key(&key)
                            .arg(&token)
                            .invoke_async(&mut c)
                            .await
                            .unwrap();
                    }
                });
                join(dels).await;
            }
            Impl::Library(floor) => {
                floor
                    .cycle(&leasehold::Key::new(key).unwrap())
                    .await
                    .unwrap();
            }
            Impl::Leasehold(locks) => {
                let g = locks
                    .lock(key)
                    .unwrap()
                    .ttl(TTL)
                    .try_acquire()
                    .await
                    .unwrap()
                    .expect("free key");
                g.release().await.unwrap();
            }
            Impl::Raw(store) => {
                let req =
                    leasehold::AcquireRequest::new(leasehold::Key::new(key).unwrap(), "bench", TTL);
                match store.acquire(&req).await.unwrap() {
                    leasehold::AcquireOutcome::Granted(_) => {}
                    other => panic!("raw: key not free: {other:?}"),
                }
                store.release(&req.key, &req.token).await.unwrap();
            }
            Impl::Rslock(m) => {
                let l = m.lock(key.as_bytes(), TTL).await.expect("rslock: free key");
                m.unlock(&l).await;
            }
        }
    }

    async fn hot(&self, key: &str) {
        match self {
            Impl::Leasehold(locks) => {
                let g = locks
                    .lock(key)
                    .unwrap()
                    .ttl(TTL)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await
                    .unwrap();
                g.release().await.unwrap();
            }
            Impl::Rslock(m) => {
                let l = m.acquire_no_guard(key.as_bytes(), TTL).await.unwrap();
                m.unlock(&l).await;
            }
            Impl::Floor(..) | Impl::Library(_) | Impl::Raw(_) => unreachable!(),
        }
    }
}

/// Awaits futures concurrently (spawned tasks).
async fn join<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = vec![];
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// The median (the upper one of an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn us(ns: u64) -> String {
    format!("{:.0} µs", ns as f64 / 1000.0)
}

#[derive(Clone)]
struct Throughput {
    per_sec: f64,
    p50: u64,
    p99: u64,
    /// CPU time of this process per cycle (µs).
    client_cpu: f64,
    /// CPU time of the Redis servers per cycle (µs).
    server_cpu: f64,
}

/// User + system CPU time of this process, µs.
fn self_cpu_us() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// User + system CPU time of the processes `pids`, µs (from /proc, 10 ms resolution).
fn procs_cpu_us(pids: &[u32]) -> f64 {
    let tick = 1e6 / 100.0;
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<f64> = after
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0.0))
                .collect();
            (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) * tick
        })
        .sum()
}

/// The server's calls and µs per call of each command since the last `CONFIG RESETSTAT`.
fn command_stats(server: &RedisServer) -> String {
    let info = server
        .command(&["INFO", "commandstats"])
        .unwrap_or_default();
    let mut out = vec![];
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                .unwrap_or("?")
                .to_owned()
        };
        if name != "config" && name != "info" {
            out.push(format!(
                "{name} {} × {} µs",
                field("calls"),
                field("usec_per_call")
            ));
        }
    }
    format!("  server: {}", out.join(", "))
}

/// `tasks` tasks on distinct keys, each looping acquire+release for `dur`.
async fn throughput(
    imp: &Impl,
    tasks: usize,
    dur: Duration,
    tag: &str,
    pids: &[u32],
) -> Throughput {
    let run = fastrand::u32(..);
    let (cpu0, srv0) = (self_cpu_us(), procs_cpu_us(pids));
    let deadline = Instant::now() + dur;
    let all = join((0..tasks).map(|t| {
        let imp = imp.clone();
        let key = format!("bench:{tag}:{run}:{t}");
        async move {
            let mut lat = vec![];
            while Instant::now() < deadline {
                let s = Instant::now();
                imp.cycle(&key).await;
                lat.push(s.elapsed().as_nanos() as u64);
            }
            lat
        }
    }))
    .await;
    let (cpu1, srv1) = (self_cpu_us(), procs_cpu_us(pids));
    let mut lat: Vec<u64> = all.into_iter().flatten().collect();
    lat.sort_unstable();
    let n = lat.len().max(1) as f64;
    Throughput {
        per_sec: lat.len() as f64 / dur.as_secs_f64(),
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        client_cpu: (cpu1 - cpu0) / n,
        server_cpu: (srv1 - srv0) / n,
    }
}

/// Waits (ns) of `tasks` tasks contending on `key` for `dur`.
async fn hot_waits(imp: &Impl, tasks: usize, dur: Duration, key: &str) -> Vec<u64> {
    let deadline = Instant::now() + dur;
    let all = join((0..tasks).map(|_| {
        let imp = imp.clone();
        let key = key.to_owned();
        async move {
            let mut waits = vec![];
            while Instant::now() < deadline {
                let s = Instant::now();
                imp.hot(&key).await;
                waits.push(s.elapsed().as_nanos() as u64);
            }
            waits
        }
    }))
    .await;
    all.into_iter().flatten().collect()
}

async fn make(kind: &str, urls: &[String]) -> Impl {
    let url = || {
        if urls.len() == 1 {
            urls[0].clone()
        } else {
            redlock_url_from(urls)
        }
    };
    match kind {
        "leasehold" => Impl::Leasehold(leasehold::connect(&url()).await.unwrap()),
        "leasehold-store" => Impl::Raw(leasehold::open_store(&url()).await.unwrap()),
        "fenced-floor" => {
            let store = leasehold::open_store(&url()).await.unwrap();
            Impl::Library(store.floor().expect("the Redis stores have a floor"))
        }
        "rslock" => Impl::Rslock(Arc::new(rslock::LockManager::new(urls.to_vec()))),
        _ => {
            let mut conns = vec![];
            for u in urls {
                if let Some(seeds) = u.strip_prefix("redis+cluster://") {
                    let nodes = seeds.split(',').map(|s| format!("redis://{s}"));
                    let client = redis::cluster::ClusterClient::new(nodes).unwrap();
                    let conn = client.get_async_connection().await.unwrap();
                    conns.push(FloorConn::Cluster(conn));
                    continue;
                }
                // The floors take no store parameters (`?replicas=1`).
                let u = u.split('?').next().unwrap_or_default();
                conns.push(FloorConn::One(
                    redis::Client::open(u)
                        .unwrap()
                        .get_connection_manager()
                        .await
                        .unwrap(),
                ));
            }
            let acquire = match kind {
                "multi-floor" => FloorAcquire::Multi,
                "wait-floor" => FloorAcquire::SetWait,
                _ => FloorAcquire::Set,
            };
            Impl::Floor(conns, Arc::new(redis::Script::new(CAD)), acquire)
        }
    }
}

/// The Redlock URL over `urls`' nodes. A smoke run (`--quick`, an unoptimised build on a busy
/// machine) gives each node 2 s to answer instead of the default 200 ms: it checks that the
/// benchmark runs, not how fast.
fn redlock_url_from(urls: &[String]) -> String {
    let nodes: Vec<&str> = urls
        .iter()
        .map(|u| u.trim_start_matches("redis://").trim_end_matches("/0"))
        .collect();
    let quick = std::env::args().any(|a| a == "--quick");
    let timeout = if quick { "?timeout=2s" } else { "" };
    format!("redlock://{}/0{timeout}", nodes.join(","))
}

/// The second process of the hot-key runs: prints its waits.
fn child(spec: &str) {
    let mut parts = spec.split('\n');
    let kind = parts.next().unwrap().to_owned();
    let tasks: usize = parts.next().unwrap().parse().unwrap();
    let dur = Duration::from_millis(parts.next().unwrap().parse().unwrap());
    let key = parts.next().unwrap().to_owned();
    let urls: Vec<String> = parts.map(str::to_owned).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let waits = rt.block_on(async {
        let imp = make(&kind, &urls).await;
        hot_waits(&imp, tasks, dur, &key).await
    });
    let mut out = std::io::stdout().lock();
    for w in waits {
        let _ = writeln!(out, "{w}");
    }
}

fn hot_key(
    rt: &tokio::runtime::Runtime,
    kind: &str,
    urls: &[String],
    tasks: usize,
    dur: Duration,
) -> String {
    let key = format!("bench:hot:{kind}:{tasks}:{}", fastrand::u32(..));
    let mut spec = format!("{kind}\n{}\n{}\n{key}", tasks / 2, dur.as_millis());
    for u in urls {
        spec.push('\n');
        spec.push_str(u);
    }
    let mut c = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = c.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.parse::<u64>().ok())
            .collect::<Vec<u64>>()
    });
    let mut waits = rt.block_on(async {
        let imp = make(kind, urls).await;
        hot_waits(&imp, tasks - tasks / 2, dur, &key).await
    });
    let _ = c.wait();
    waits.extend(reader.join().unwrap());
    waits.sort_unstable();
    format!(
        "| {kind} | {tasks} | {:.0} | {} | {} | {} | {} |",
        waits.len() as f64 / dur.as_secs_f64(),
        us(pct(&waits, 0.5)),
        us(pct(&waits, 0.99)),
        us(pct(&waits, 0.999)),
        us(*waits.last().unwrap_or(&0)),
    )
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // `-- stats` prints, after each single-node run, the server's time per command (what the
    // server spends its CPU on).
    let stats = std::env::args().any(|a| a == "stats");
    let dur = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    // `-- rounds=N`: each throughput row is the median of N interleaved runs (default 3; 1 with
    // `--quick`).
    let rounds: usize = std::env::args()
        .find_map(|a| a.strip_prefix("rounds=").and_then(|n| n.parse().ok()))
        .unwrap_or(if quick { 1 } else { 3 })
        .max(1);
    let one = RedisServer::start();
    let three: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    // `-- unix`: the one-node runs go through the server's Unix socket (`redis+unix://`);
    // `-- cluster`: on a Redis Cluster (`redis+cluster://`).
    let unix = std::env::args().any(|a| a == "unix");
    let cluster = std::env::args()
        .any(|a| a == "cluster")
        .then(RedisCluster::start);
    // `-- replicas`: the one server gets a replica, and leasehold `?replicas=1`.
    let replica = std::env::args().any(|a| a == "replicas").then(|| {
        let replica = RedisServer::start();
        let port = one.port.to_string();
        replica.command(&["REPLICAOF", "127.0.0.1", &port]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica.replica_synced() {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    });
    let one_url = vec![match &cluster {
        Some(c) => c.url(),
        None if unix => one.unix_url(),
        None if replica.is_some() => format!("{}?replicas=1", one.url()),
        None => one.url(),
    }];
    let three_urls: Vec<String> = three.iter().map(|s| s.url()).collect();
    let _ = redlock_url(&three);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let one_pids: Vec<u32> = match &cluster {
        Some(c) => c.nodes.iter().filter_map(|s| s.pid()).collect(),
        None => one
            .pid()
            .into_iter()
            .chain(replica.iter().filter_map(|s| s.pid()))
            .collect(),
    };
    let three_pids: Vec<u32> = three.iter().filter_map(|s| s.pid()).collect();
    let second_floor = if replica.is_some() {
        "wait-floor"
    } else {
        "fenced-floor"
    };
    println!("\n| store | tasks | implementation | cycles/s | p50 | p99 | vs floor | vs {second_floor} | client CPU/cycle | server CPU/cycle |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // `-- only=KIND[,KIND…]` and `-- tasks=N[,N…]` narrow the throughput runs (for profiling).
    let arg = |name: &str| {
        std::env::args().find_map(|a| a.strip_prefix(&format!("{name}=")).map(str::to_owned))
    };
    let only = arg("only");
    let task_counts: Vec<usize> = arg("tasks")
        .map(|t| t.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 64]);
    // `-- only=hot` runs the hot-key runs alone.
    let hot_only = only.as_deref() == Some("hot");
    let one_label = if cluster.is_some() {
        "redis cluster, 3 primaries"
    } else if replica.is_some() {
        "redis, 1 node + replica, replicas=1"
    } else if unix {
        "redis, 1 node, Unix socket"
    } else {
        "redis, 1 node"
    };
    for (label, urls, pids) in [
        (one_label, &one_url, &one_pids),
        ("redlock, 3 nodes", &three_urls, &three_pids),
    ] {
        // With `-- cluster` or `-- replicas`, the one-node rows alone.
        if hot_only || ((cluster.is_some() || replica.is_some()) && label.starts_with("redlock")) {
            break;
        }
        for &tasks in &task_counts {
            let kinds: Vec<&str> = [
                "floor",
                second_floor,
                "multi-floor",
                "leasehold",
                "leasehold-store",
                "rslock",
            ]
            .into_iter()
            // With a replica, leasehold beside the floors only.
            .filter(|kind| replica.is_none() || !matches!(*kind, "multi-floor" | "rslock"))
            .filter(|kind| {
                let named = |o: &str| o.split(',').any(|k| k == *kind);
                *kind == "floor" || only.as_deref().map_or(*kind != "multi-floor", named)
            })
            // rslock has no cluster mode (it takes independent masters).
            .filter(|kind| !(label.starts_with("redis cluster") && *kind == "rslock"))
            .collect();
            // Rounds interleave the implementations, so a slow spell of the shared VM hits them
            // alike; each ratio is taken within its round (against that round's floor).
            let mut runs: Vec<Vec<Throughput>> = vec![vec![]; kinds.len()];
            for _ in 0..rounds {
                for (i, kind) in kinds.iter().enumerate() {
                    if stats {
                        let _ = one.command(&["CONFIG", "RESETSTAT"]);
                    }
                    let t = rt.block_on(async {
                        let imp = make(kind, urls).await;
                        throughput(&imp, tasks, dur, kind, pids).await
                    });
                    if stats && label.starts_with("redis") {
                        println!("{}", command_stats(&one));
                    }
                    runs[i].push(t);
                }
            }
            // The ratio to `base`'s runs: the median of the per-round ratios, with their range.
            let ratio = |ts: &[Throughput], base: &[Throughput]| {
                let mut ratios: Vec<f64> = ts
                    .iter()
                    .zip(base)
                    .map(|(t, f)| t.per_sec / f.per_sec)
                    .collect();
                ratios.sort_by(f64::total_cmp);
                let spread = if ratios.len() > 1 {
                    format!(" ({:.2}–{:.2})", ratios[0], ratios[ratios.len() - 1])
                } else {
                    String::new()
                };
                format!("{:.2}×{spread}", median(ratios))
            };
            let fenced = kinds.iter().position(|k| *k == second_floor);
            for (kind, ts) in kinds.iter().zip(&runs) {
                let med = |f: fn(&Throughput) -> f64| median(ts.iter().map(f).collect());
                let vs_fenced = fenced.map_or_else(|| "—".to_owned(), |j| ratio(ts, &runs[j]));
                println!(
                    "| {label} | {tasks} | {kind} | {:.0} | {} | {} | {} | {vs_fenced} | {:.1} µs | {:.1} µs |",
                    med(|t| t.per_sec),
                    us(med(|t| t.p50 as f64) as u64),
                    us(med(|t| t.p99 as f64) as u64),
                    ratio(ts, &runs[0]),
                    med(|t| t.client_cpu),
                    med(|t| t.server_cpu),
                );
            }
        }
    }

    if only.is_some() && !hot_only {
        return;
    }
    println!("\n| hot key (redis, 2 processes) | tasks | handoffs/s | p50 wait | p99 wait | p99.9 wait | longest wait |");
    println!("|---|---|---|---|---|---|---|");
    for tasks in [8usize, 64] {
        for kind in ["leasehold", "rslock"] {
            if (cluster.is_some() || replica.is_some()) && kind == "rslock" {
                continue;
            }
            println!("{}", hot_key(&rt, kind, &one_url, tasks, dur));
        }
    }
}
