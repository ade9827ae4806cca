//! leasehold benchmarks, each beside its floor measured in the same run, printed as ratios.
//!
//! `cargo bench -p leasehold --bench locks` (about a minute), `-- --quick` for a smoke run.
//!
//! Uncontended acquire+release (single-thread runtime, so the numbers are about the code):
//! * the local layer vs `tokio::sync::Mutex` and a DashMap of `Arc<tokio::sync::Mutex>` (floor);
//! * the memory store through `Locks`;
//! * the file store through `Locks` vs raw `open(O_CREAT|O_EXCL)`+`close`+`unlink` and
//!   `flock(LOCK_EX)`+`flock(LOCK_UN)` (floors), with and without `fsync=true`.
//!
//! Contended: cross-process handoff latency on the file store — two OS processes (this binary
//! re-executed as the second) take turns on one key; the time from one's release to the other
//! holding the lease, by CLOCK_MONOTONIC (shared by the processes of a host).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use leasehold::file::{FileOptions, FileStore};
use leasehold::memory::MemoryStore;
use leasehold::{Key, LocalLocks, Locks};
use std::ffi::CString;
use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "LEASEHOLD_BENCH_CHILD";

struct Stat {
    median_ns: f64,
    p99_ns: f64,
}

/// Runs `op` in batches; per-op time of each batch; median and p99 over the batches.
fn measure<F, Fut>(rt: &tokio::runtime::Runtime, samples: usize, batch: usize, mut op: F) -> Stat
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    rt.block_on(async {
        for _ in 0..batch {
            op().await;
        }
        let mut per_op = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            for _ in 0..batch {
                op().await;
            }
            per_op.push(t.elapsed().as_nanos() as f64 / batch as f64);
        }
        per_op.sort_by(|a, b| a.total_cmp(b));
        Stat {
            median_ns: per_op[per_op.len() / 2],
            p99_ns: per_op[((per_op.len() as f64 * 0.99) as usize).min(per_op.len() - 1)],
        }
    })
}

fn mono_ns() -> u64 {
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

struct Row {
    case: String,
    stat: Stat,
    floor: Option<(String, f64)>,
    target: Option<f64>,
}

/// The second process of the handoff benchmark: takes turns on the key, prints events.
fn child(dir: &str, rounds: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(handoff_participant(dir, rounds, |line| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }));
}

async fn handoff_participant(dir: &str, rounds: usize, mut emit: impl FnMut(String)) {
    let store = FileStore::open(dir, FileOptions::default()).unwrap();
    let locks = Locks::new(store).with_local_layer(false);
    let key = Key::new("handoff").unwrap();
    emit(format!("ready {}", mono_ns()));
    for _ in 0..rounds {
        let g = locks
            .lock_key(key.clone())
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        emit(format!("acq {}", mono_ns()));
        // Hold briefly so the other process is waiting when we release.
        let until = Instant::now() + Duration::from_micros(200);
        while Instant::now() < until {
            tokio::task::yield_now().await;
        }
        emit(format!("rel {}", mono_ns()));
        g.release().await.unwrap();
        // Give the waiter its turn: it is reserved for it, so we simply ask again (and wait).
    }
    emit("done 0".to_owned());
}

fn handoff(rounds: usize) -> Option<Stat> {
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap().to_owned();
    let mut c = Command::new(std::env::current_exe().ok()?)
        .env(CHILD_ENV, format!("{dir_s}\n{rounds}"))
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let out = BufReader::new(c.stdout.take()?);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, String, u64)>();
    let tx2 = tx.clone();
    let reader = std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let mut p = line.split(' ');
            let (k, v) = (
                p.next().unwrap_or("").to_owned(),
                p.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            );
            let _ = tx2.send((1, k, v));
        }
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(handoff_participant(&dir_s, rounds, |line| {
        let mut p = line.split(' ');
        let (k, v) = (
            p.next().unwrap_or("").to_owned(),
            p.next().and_then(|v| v.parse().ok()).unwrap_or(0),
        );
        let _ = tx.send((0, k, v));
    }));
    let _ = c.wait();
    let _ = reader.join();
    drop(tx);
    let mut events: Vec<(usize, String, u64)> = rx
        .into_iter()
        .filter(|e| e.1 == "acq" || e.1 == "rel")
        .collect();
    events.sort_by_key(|e| e.2);
    let mut lat = vec![];
    for (i, e) in events.iter().enumerate() {
        if e.1 == "rel" {
            if let Some(next) = events[i + 1..].iter().find(|n| n.1 == "acq") {
                if next.0 != e.0 {
                    lat.push((next.2 - e.2) as f64);
                }
            }
        }
    }
    if lat.is_empty() {
        return None;
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| lat[((lat.len() as f64 * f) as usize).min(lat.len() - 1)];
    eprintln!(
        "handoffs between processes: {} of {} releases; p50 {}, p99 {}, max {}",
        lat.len(),
        2 * rounds,
        fmt_ns(q(0.5)),
        fmt_ns(q(0.99)),
        fmt_ns(*lat.last().unwrap())
    );
    Some(Stat {
        median_ns: q(0.5),
        p99_ns: q(0.99),
    })
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let mut parts = spec.splitn(2, '\n');
        let dir = parts.next().unwrap_or_default().to_owned();
        let rounds = parts.next().and_then(|r| r.parse().ok()).unwrap_or(100);
        child(&dir, rounds);
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let (samples, scale) = if quick { (5, 10) } else { (60, 1) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rows: Vec<Row> = vec![];

    // --- in-process ---------------------------------------------------------------------
    let batch = 20_000 / scale;
    let tmutex = Arc::new(tokio::sync::Mutex::new(()));
    let t_mutex = measure(&rt, samples, batch, || {
        let m = tmutex.clone();
        async move {
            drop(m.lock().await);
        }
    });
    let dash: Arc<dashmap::DashMap<String, Arc<tokio::sync::Mutex<()>>>> = Arc::default();
    let t_dash = measure(&rt, samples, batch, || {
        let d = dash.clone();
        async move {
            // The fast path of a DashMap of mutexes: look up by &str, insert only when missing.
            let m = match d.get("user:alice") {
                Some(m) => m.clone(),
                None => d.entry("user:alice".to_owned()).or_default().clone(),
            };
            drop(m.lock_owned().await);
        }
    });
    let local = LocalLocks::new();
    let t_local = measure(&rt, samples, batch, || {
        let l = local.clone();
        async move {
            drop(l.lock("user:alice").await);
        }
    });
    rows.push(Row {
        case: "tokio::sync::Mutex lock+unlock".into(),
        stat: t_mutex,
        floor: None,
        target: None,
    });
    let dash_ns = t_dash.median_ns;
    rows.push(Row {
        case: "DashMap of tokio mutexes (floor)".into(),
        stat: t_dash,
        floor: None,
        target: None,
    });
    rows.push(Row {
        case: "local layer (LocalLocks) lock+unlock".into(),
        stat: t_local,
        floor: Some(("DashMap of mutexes".into(), dash_ns)),
        target: Some(2.0),
    });

    let mem = rt.block_on(async { Locks::new(MemoryStore::new()).with_local_layer(false) });
    let key = Key::new("user:alice").unwrap();
    let batch_store = 5_000 / scale;
    let t_mem = measure(&rt, samples, batch_store, || {
        let (mem, key) = (mem.clone(), key.clone());
        async move {
            let g = mem.lock_key(key).try_acquire().await.unwrap().unwrap();
            g.release().await.unwrap();
        }
    });
    let mem_local = rt.block_on(async { Locks::new(MemoryStore::new()) });
    let t_mem_local = measure(&rt, samples, batch_store, || {
        let (mem, key) = (mem_local.clone(), key.clone());
        async move {
            let g = mem.lock_key(key).try_acquire().await.unwrap().unwrap();
            g.release().await.unwrap();
        }
    });
    rows.push(Row {
        case: "memory store via Locks (guard, renewal task)".into(),
        stat: t_mem,
        floor: Some(("DashMap of mutexes".into(), dash_ns)),
        target: None,
    });
    rows.push(Row {
        case: "memory store via Locks + local layer".into(),
        stat: t_mem_local,
        floor: Some(("DashMap of mutexes".into(), dash_ns)),
        target: None,
    });

    // --- files --------------------------------------------------------------------------
    let dir = tempfile::tempdir().unwrap();
    let excl = CString::new(dir.path().join("excl.lock").to_str().unwrap()).unwrap();
    let batch_file = 2_000 / scale;
    let t_excl = measure(&rt, samples, batch_file, || {
        let p = excl.as_ptr();
        async move {
            unsafe {
                let fd = libc::open(
                    p,
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o600,
                );
                assert!(fd >= 0);
                libc::close(fd);
                libc::unlink(p);
            }
        }
    });
    let flock_file = std::fs::File::create(dir.path().join("flock.lock")).unwrap();
    let ffd = flock_file.as_raw_fd();
    let t_flock = measure(&rt, samples, batch_file * 5, || async move {
        unsafe {
            libc::flock(ffd, libc::LOCK_EX);
            libc::flock(ffd, libc::LOCK_UN);
        }
    });
    let excl_ns = t_excl.median_ns;
    let flock_ns = t_flock.median_ns;
    rows.push(Row {
        case: "raw open(O_EXCL)+close+unlink (floor)".into(),
        stat: t_excl,
        floor: None,
        target: None,
    });
    rows.push(Row {
        case: "raw flock(LOCK_EX)+flock(LOCK_UN)".into(),
        stat: t_flock,
        floor: None,
        target: None,
    });

    let fstore = FileStore::open(dir.path().join("store"), FileOptions::default()).unwrap();
    let raw = fstore.clone();
    let t_raw = measure(&rt, samples, batch_file, || {
        let (s, key) = (raw.clone(), key.clone());
        async move {
            use leasehold::LockStore;
            let req = leasehold::AcquireRequest::new(key.clone(), "bench", Duration::from_secs(30));
            let _ = s.acquire(&req).await.unwrap();
            s.release(&key, &req.token).await.unwrap();
        }
    });
    rows.push(Row {
        case: "file store, raw LockStore acquire+release".into(),
        stat: t_raw,
        floor: Some(("O_EXCL+unlink".into(), excl_ns)),
        target: None,
    });
    let files = rt.block_on(async { Locks::new(fstore.clone()).with_local_layer(false) });
    let t_file = measure(&rt, samples, batch_file, || {
        let (l, key) = (files.clone(), key.clone());
        async move {
            let g = l.lock_key(key).try_acquire().await.unwrap().unwrap();
            g.release().await.unwrap();
        }
    });
    rows.push(Row {
        case: "file store via Locks (guard, renewal task)".into(),
        stat: t_file,
        floor: Some(("O_EXCL+unlink".into(), excl_ns)),
        target: Some(3.0),
    });
    let fsync_store = FileStore::open(
        dir.path().join("fsync"),
        FileOptions {
            fsync: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    let fsync_locks = rt.block_on(async { Locks::new(fsync_store).with_local_layer(false) });
    let t_fsync = measure(&rt, samples.min(20), (batch_file / 10).max(10), || {
        let (l, key) = (fsync_locks.clone(), key.clone());
        async move {
            let g = l.lock_key(key).try_acquire().await.unwrap().unwrap();
            g.release().await.unwrap();
        }
    });
    rows.push(Row {
        case: "file store via Locks, fsync=true".into(),
        stat: t_fsync,
        floor: Some(("O_EXCL+unlink".into(), excl_ns)),
        target: None,
    });
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let files_mt = mt.block_on(async { Locks::new(fstore.clone()).with_local_layer(false) });
    let t_file_mt = measure(&mt, samples, batch_file, || {
        let (l, key) = (files_mt.clone(), key.clone());
        async move {
            let g = l.lock_key(key).try_acquire().await.unwrap().unwrap();
            g.release().await.unwrap();
        }
    });
    rows.push(Row {
        case: "file store via Locks, multi-thread runtime".into(),
        stat: t_file_mt,
        floor: Some(("O_EXCL+unlink".into(), excl_ns)),
        target: None,
    });
    let _ = flock_ns;

    // --- report -------------------------------------------------------------------------
    let handoff_stat = handoff(if quick { 50 } else { 1000 });
    println!();
    println!("| case | median | p99 (of batch means) | floor | ratio | target | met |");
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        let (floor, ratio) = match &r.floor {
            Some((name, ns)) => (name.clone(), format!("{:.2}×", r.stat.median_ns / ns)),
            None => ("—".into(), "—".into()),
        };
        let (target, met) = match (r.target, &r.floor) {
            (Some(t), Some((_, ns))) => (
                format!("≤ {t}×"),
                if r.stat.median_ns / ns <= t {
                    "yes"
                } else {
                    "no"
                },
            ),
            _ => ("".into(), ""),
        };
        println!(
            "| {} | {} | {} | {floor} | {ratio} | {target} | {met} |",
            r.case,
            fmt_ns(r.stat.median_ns),
            fmt_ns(r.stat.p99_ns)
        );
    }
    match handoff_stat {
        Some(h) => println!(
            "| file store cross-process handoff (release → other process holds) | {} | {} (per handoff) | — | — | p99 ≤ 1 ms | {} |",
            fmt_ns(h.median_ns),
            fmt_ns(h.p99_ns),
            if h.p99_ns <= 1e6 { "yes" } else { "no" }
        ),
        None => println!("| file store cross-process handoff | no handoffs observed | | | | | no |"),
    }
}
