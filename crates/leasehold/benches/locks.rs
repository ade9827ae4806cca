//! leasehold benchmarks: every case beside the floor it is judged against, both measured in the same
//! run, reported as ratios.
//!
//! `cargo bench -p leasehold --bench locks` runs everything in about 20 s;
//! `cargo bench -p leasehold --bench locks -- --quick` is a two-second smoke run (CI). Words after
//! `--` pick sections: `memory`, `file`, `handoff` (default: all). The process exits non-zero only
//! when a case fails (an error, or the lock was found broken), never because a target was missed:
//! timing on shared machines is too noisy to gate on. The load average before and after is printed;
//! figures taken while other work runs on the machine are not comparable.
//!
//! # Uncontended acquire + release (one key, single-thread tokio runtime)
//! * the local layer ([`LocalLocks`] lock + drop) vs `tokio::sync::Mutex` lock + unlock and the
//!   floor a DashMap of `Arc<tokio::sync::Mutex<()>>` (`entry(key).or_insert_with`, clone the Arc,
//!   `lock_owned`, drop);
//! * the memory store through [`Locks`] with the local layer off and on;
//! * the file store through [`Locks`] (local layer off) vs raw `open(O_CREAT|O_EXCL)` + `close` +
//!   `unlink` (the floor) and `flock(LOCK_EX)` + `flock(LOCK_UN)` on an open descriptor; with
//!   `fsync=true` for the durability cost; on a multi-thread runtime for reference;
//! * raw `LockStore::acquire` + `release` calls on both stores, to tell the store's cost from the
//!   client's (guard, renewal task, tracing span).
//!
//! Each case runs a warm-up (which also sizes the batch so one batch lasts about 20 µs), then timed
//! batches; the figures are the median and the 99th percentile of the per-operation time of the
//! batches (for operations slower than the batch target a batch is one operation, so the p99 is a
//! per-operation p99). Cases whose guard spawns a renewal task yield to the runtime inside the timed
//! region (after every batch, at most every 48 operations), so the cost of reaping the aborted
//! renewal tasks is counted where it is paid.
//!
//! # Contended: cross-process handoff on the file store
//! This binary re-executes itself (`LEASEHOLD_BENCH_HANDOFF_CHILD` set) as a second process; both
//! open one store directory and take turns on one key: `acquire` (waiting), note the time, hold
//! briefly, note the time, `release`. Times are `CLOCK_MONOTONIC`, which all processes of a host
//! share. Merging the two event logs, every release followed by the other process's acquisition is
//! one handoff; its latency is release → the other process holds the lease. The merged log is also
//! checked for overlapping holds. The floor is the same two processes passing the turn with one byte
//! through a pipe (blocking `read`): the bare cost of waking another process on this machine.
//! `LEASEHOLD_BENCH_DEBUG=1` prints more quantiles of both.

use leasehold::stores::file::{FileOptions, FileStore};
use leasehold::stores::memory::MemoryStore;
use leasehold::{AcquireOutcome, AcquireRequest, Key, LocalLocks, LockStore, Locks, Released};
use std::ffi::CString;
use std::fmt::Display;
use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

/// Set in the environment of the re-executed second process of the handoff benchmark.
const CHILD_ENV: &str = "LEASEHOLD_BENCH_HANDOFF_CHILD";
/// The key of every per-operation case (it needs hashing into a file name, as most real keys do).
const KEY: &str = "user:alice";
/// The key the two processes of the handoff benchmark take turns on.
const HANDOFF_KEY: &str = "bench:handoff";

type OpResult = Result<(), String>;

/// Attaches what was being done to an error, for messages.
trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

fn die(msg: impl Display) -> ! {
    eprintln!("locks bench: {msg}");
    std::process::exit(1)
}

/// How long and how often to measure.
#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    /// Warm-up (and batch sizing) time per case.
    warmup: Duration,
    /// Measuring time per case (stretched to reach `min_samples`).
    budget: Duration,
    min_samples: usize,
    max_samples: usize,
    /// Wanted duration of one timed batch.
    batch_target_ns: f64,
    /// Acquisitions per process in the handoff benchmark.
    handoff_rounds: usize,
    /// How long each process holds the lease in the handoff benchmark.
    handoff_hold: Duration,
}

impl Config {
    fn new(quick: bool) -> Self {
        if quick {
            Config {
                quick,
                warmup: Duration::from_millis(10),
                budget: Duration::from_millis(60),
                min_samples: 30,
                max_samples: 2_000,
                batch_target_ns: 20_000.0,
                handoff_rounds: 100,
                handoff_hold: Duration::from_micros(300),
            }
        } else {
            Config {
                quick,
                warmup: Duration::from_millis(150),
                budget: Duration::from_millis(1_500),
                min_samples: 300,
                max_samples: 50_000,
                batch_target_ns: 20_000.0,
                handoff_rounds: 650,
                handoff_hold: Duration::from_micros(300),
            }
        }
    }
}

/// Per-operation figures of one case.
#[derive(Debug, Clone, Copy)]
struct Stat {
    median_ns: f64,
    p99_ns: f64,
    samples: usize,
    batch: usize,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Measures `op` on `rt`, inside a task of that runtime (as application code runs).
///
/// `spawns`: the operation leaves tasks to reap (a guard's aborted renewal task); the timed region
/// then yields to the scheduler after every batch, and at least every 48 operations (the
/// current-thread scheduler runs at most 61 tasks per yield).
fn measure<F, Fut>(rt: &Runtime, cfg: &Config, spawns: bool, mut op: F) -> Result<Stat, String>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = OpResult> + Send,
{
    let cfg = cfg.clone();
    let task = rt.spawn(async move {
        // Warm-up, sizing the batch on the way.
        let started = Instant::now();
        let mut done = 0u64;
        while done < 16 || started.elapsed() < cfg.warmup {
            for _ in 0..16 {
                op().await?;
            }
            done += 16;
            tokio::task::yield_now().await;
        }
        let est_ns = (started.elapsed().as_nanos() as f64 / done as f64).max(1.0);
        let batch = ((cfg.batch_target_ns / est_ns).ceil() as usize).clamp(1, 100_000);
        let samples = ((cfg.budget.as_nanos() as f64 / (est_ns * batch as f64)) as usize)
            .clamp(cfg.min_samples, cfg.max_samples);
        let yield_every = if spawns { batch.min(48) } else { usize::MAX };
        let mut per_op = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            for i in 1..=batch {
                op().await?;
                if i % yield_every == 0 {
                    tokio::task::yield_now().await;
                }
            }
            per_op.push(t.elapsed().as_nanos() as f64 / batch as f64);
        }
        per_op.sort_by(f64::total_cmp);
        Ok(Stat {
            median_ns: quantile(&per_op, 0.5),
            p99_ns: quantile(&per_op, 0.99),
            samples,
            batch,
        })
    });
    rt.block_on(task).ctx("benchmark task")?
}

fn mono_ns() -> u64 {
    // SAFETY: an all-zero timespec is a valid value for clock_gettime to overwrite.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid, writable timespec. CLOCK_MONOTONIC cannot fail on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `1,234,567`
fn grouped(ns: f64) -> String {
    if !ns.is_finite() {
        return "—".into();
    }
    let s = format!("{:.0}", ns);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn human(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// What a row is judged against.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    None,
    /// median ≤ this × the floor's median.
    Ratio(f64),
    /// p99 ≤ this many ns.
    P99Ns(f64),
}

#[derive(Debug)]
struct Row {
    /// Short name, shown in the floor column of the rows compared with this one.
    id: &'static str,
    case: String,
    stat: Result<Stat, String>,
    /// The id (short name) of the row this one is compared with.
    floor: Option<&'static str>,
    target: Target,
}

#[derive(Default, Debug)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(
        &mut self,
        id: &'static str,
        case: impl Into<String>,
        stat: Result<Stat, String>,
        floor: Option<&'static str>,
        target: Target,
    ) {
        let case = case.into();
        match &stat {
            Ok(s) => println!(
                "{case:<62} median {:>10}  p99 {:>10}  ({} samples × {} ops)",
                human(s.median_ns),
                human(s.p99_ns),
                s.samples,
                s.batch
            ),
            Err(e) => println!("{case:<62} FAILED: {e}"),
        }
        self.rows.push(Row {
            id,
            case,
            stat,
            floor,
            target,
        });
    }

    fn median_of(&self, id: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| r.stat.as_ref().ok())
            .map(|s| s.median_ns)
    }

    /// Prints the markdown table; returns (failed cases, missed targets).
    fn print_table(&self) -> (usize, usize) {
        let (mut failed, mut missed) = (0, 0);
        println!();
        println!("| case | median ns | p99 ns | floor | ratio | target | met? |");
        println!("|---|---:|---:|---|---:|---|---|");
        for r in &self.rows {
            let Ok(s) = &r.stat else {
                failed += 1;
                println!("| {} | failed | | | | | no |", r.case);
                continue;
            };
            let floor_ns = r.floor.and_then(|f| self.median_of(f));
            let ratio = floor_ns.map(|f| s.median_ns / f);
            let floor = match (r.floor, floor_ns) {
                (Some(f), Some(ns)) => format!("{f} ({} ns)", grouped(ns)),
                (Some(f), None) => format!("{f} (failed)"),
                (None, _) => "—".into(),
            };
            let (target, met) = match r.target {
                Target::None => ("—".to_owned(), "—"),
                Target::Ratio(t) => (
                    format!("≤ {t}× floor"),
                    match ratio {
                        Some(x) if x <= t => "yes",
                        _ => "no",
                    },
                ),
                Target::P99Ns(t) => (
                    format!("p99 ≤ {}", human(t)),
                    if s.p99_ns <= t { "yes" } else { "no" },
                ),
            };
            if met == "no" {
                missed += 1;
            }
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.case,
                grouped(s.median_ns),
                grouped(s.p99_ns),
                floor,
                ratio.map_or("—".into(), |x| format!("{x:.2}×")),
                target,
                met
            );
        }
        (failed, missed)
    }
}

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| die(format!("cannot build a tokio runtime: {e}")))
}

fn multi_thread() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| die(format!("cannot build a tokio runtime: {e}")))
}

fn key(s: &str) -> Key {
    Key::new(s).unwrap_or_else(|e| die(format!("key {s:?}: {e}")))
}

/// One `try_acquire` + `release` through `Locks`, checking both answers.
async fn locks_cycle(locks: Locks, key: Key) -> OpResult {
    let g = locks
        .lock_key(key)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .ctx("try_acquire")?
        .ok_or("try_acquire: the key is held, but nobody else uses it")?;
    match g.release().await.ctx("release")? {
        Released::Released => Ok(()),
        other => Err(format!("release answered {other:?}")),
    }
}

/// One raw `LockStore::acquire` + `release`.
async fn store_cycle(store: &dyn LockStore, key: Key) -> OpResult {
    let req = AcquireRequest::new(key, "bench", Duration::from_secs(30));
    match store.acquire(&req).await.ctx("acquire")? {
        AcquireOutcome::Granted(_) => {}
        AcquireOutcome::Held(r) => return Err(format!("acquire: held by {:?}", r.holder)),
    }
    store
        .release(&req.key, &req.token)
        .await
        .ctx("release")
        .map(drop)
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes())
        .unwrap_or_else(|_| die(format!("path {} contains NUL", p.display())))
}

fn in_process(rt: &Runtime, cfg: &Config, report: &mut Report) {
    let k = key(KEY);

    let mutex = Arc::new(tokio::sync::Mutex::new(()));
    let stat = measure(rt, cfg, false, move || {
        let m = mutex.clone();
        async move {
            drop(m.lock().await);
            Ok(())
        }
    });
    report.add(
        "tokio Mutex",
        "tokio::sync::Mutex lock + unlock",
        stat,
        None,
        Target::None,
    );

    let dash: Arc<dashmap::DashMap<String, Arc<tokio::sync::Mutex<()>>>> = Arc::default();
    let stat = measure(rt, cfg, false, move || {
        let dash = dash.clone();
        async move {
            let m = dash
                .entry(KEY.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
                .clone();
            drop(m.lock_owned().await);
            Ok(())
        }
    });
    report.add(
        "DashMap floor",
        "DashMap<String, Arc<tokio Mutex>> lock + unlock",
        stat,
        None,
        Target::None,
    );

    let local = LocalLocks::new();
    let stat = measure(rt, cfg, false, move || {
        let local = local.clone();
        async move {
            drop(local.lock(KEY).await);
            Ok(())
        }
    });
    report.add(
        "LocalLocks",
        "local layer: LocalLocks lock + drop",
        stat,
        Some("DashMap floor"),
        Target::Ratio(2.0),
    );

    let store: Arc<dyn LockStore> = Arc::new(MemoryStore::new());
    let kk = k.clone();
    let stat = measure(rt, cfg, false, move || {
        let (store, key) = (store.clone(), kk.clone());
        async move { store_cycle(&*store, key).await }
    });
    report.add(
        "raw MemoryStore",
        "memory store, raw LockStore acquire + release",
        stat,
        Some("DashMap floor"),
        Target::None,
    );

    let locks = Locks::new(MemoryStore::new()).with_local_layer(false);
    let kk = k.clone();
    let stat = measure(rt, cfg, true, move || {
        locks_cycle(locks.clone(), kk.clone())
    });
    report.add(
        "memory via Locks",
        "memory store via Locks, local layer off",
        stat,
        Some("DashMap floor"),
        Target::None,
    );

    let locks = Locks::new(MemoryStore::new()).with_local_layer(true);
    let stat = measure(rt, cfg, true, move || locks_cycle(locks.clone(), k.clone()));
    report.add(
        "memory via Locks + local",
        "memory store via Locks, local layer on",
        stat,
        Some("DashMap floor"),
        Target::None,
    );
}

/// The floor of the file store: `open(O_CREAT|O_EXCL)` + `close` + `unlink`.
fn excl_cycle(path: &CString) -> OpResult {
    let p = path.as_ptr();
    // SAFETY: p points into `path`, a NUL-terminated string alive for the whole function.
    unsafe {
        let fd = libc::open(
            p,
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o600,
        );
        if fd < 0 {
            return Err(format!("open: {}", std::io::Error::last_os_error()));
        }
        libc::close(fd);
        if libc::unlink(p) != 0 {
            return Err(format!("unlink: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn files(rt: &Runtime, cfg: &Config, report: &mut Report, dir: &Path) {
    let k = key(KEY);

    let excl = c_path(&dir.join("excl.lock"));
    let stat = measure(rt, cfg, false, move || {
        std::future::ready(excl_cycle(&excl))
    });
    report.add(
        "O_EXCL+unlink",
        "raw open(O_CREAT|O_EXCL) + close + unlink",
        stat,
        None,
        Target::None,
    );

    let stat = std::fs::File::create(dir.join("flock.lock"))
        .ctx("create flock.lock")
        .and_then(|file| {
            measure(rt, cfg, false, move || {
                let fd = file.as_raw_fd();
                // SAFETY: fd belongs to `file`, which the closure keeps open.
                let rc = unsafe {
                    (
                        libc::flock(fd, libc::LOCK_EX),
                        libc::flock(fd, libc::LOCK_UN),
                    )
                };
                std::future::ready(if rc == (0, 0) {
                    Ok(())
                } else {
                    Err(format!("flock: {}", std::io::Error::last_os_error()))
                })
            })
        });
    report.add(
        "flock",
        "raw flock(LOCK_EX) + flock(LOCK_UN) on an open fd",
        stat,
        None,
        Target::None,
    );

    let open = |name: &str, fsync: bool| {
        FileStore::open(
            dir.join(name),
            FileOptions::default().with_mode(0o600).with_fsync(fsync),
        )
        .unwrap_or_else(|e| die(format!("cannot open a file store: {e}")))
    };

    let store: Arc<dyn LockStore> = Arc::new(open("raw", false));
    let kk = k.clone();
    let stat = measure(rt, cfg, false, move || {
        let (store, key) = (store.clone(), kk.clone());
        async move { store_cycle(&*store, key).await }
    });
    report.add(
        "raw FileStore",
        "file store, raw LockStore acquire + release",
        stat,
        Some("O_EXCL+unlink"),
        Target::None,
    );

    let locks = Locks::new(open("locks", false)).with_local_layer(false);
    let kk = k.clone();
    let stat = measure(rt, cfg, true, move || {
        locks_cycle(locks.clone(), kk.clone())
    });
    report.add(
        "file via Locks",
        "file store via Locks, local layer off",
        stat,
        Some("O_EXCL+unlink"),
        Target::Ratio(3.0),
    );

    // fdatasync twice per cycle: fewer samples suffice and the budget would not buy many more.
    let fsync_cfg = Config {
        budget: cfg.budget / 2,
        min_samples: cfg.min_samples.min(100),
        ..cfg.clone()
    };
    let locks = Locks::new(open("fsync", true)).with_local_layer(false);
    let kk = k.clone();
    let stat = measure(rt, &fsync_cfg, true, move || {
        locks_cycle(locks.clone(), kk.clone())
    });
    report.add(
        "file via Locks, fsync",
        "file store via Locks, fsync=true",
        stat,
        Some("file via Locks"),
        Target::None,
    );

    let mt = multi_thread();
    let locks = Locks::new(open("mt", false)).with_local_layer(false);
    let stat = measure(&mt, cfg, true, move || {
        locks_cycle(locks.clone(), k.clone())
    });
    report.add(
        "file via Locks, mt",
        "file store via Locks, multi-thread runtime (reference)",
        stat,
        Some("O_EXCL+unlink"),
        Target::None,
    );
}

// --- cross-process handoff ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Acq,
    Rel,
}

type Events = Vec<(Ev, u64)>;

/// How the two processes of a handoff run pass the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Through the file store: `acquire` (waiting) and `release` on one key.
    Lease,
    /// The floor: a byte through a pipe, read blocking (the bare cost of waking another process).
    Pipe,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Lease => "lease",
            Mode::Pipe => "pipe",
        }
    }
}

/// Holds the turn for `hold`, busy (as a short critical section would), staying responsive to
/// the runtime.
async fn hold_async(hold: Duration) {
    let until = Instant::now() + hold;
    while Instant::now() < until {
        tokio::task::yield_now().await;
    }
}

fn hold_sync(hold: Duration) {
    let until = Instant::now() + hold;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// One process's side of the lease handoff: `rounds` times acquire (waiting), hold, release.
async fn lease_participant(dir: &Path, rounds: usize, hold: Duration) -> Result<Events, String> {
    let store = FileStore::open(dir, FileOptions::default()).ctx("open the store")?;
    let locks = Locks::new(store).with_local_layer(false);
    let key = Key::new(HANDOFF_KEY).ctx("key")?;
    let mut events = Vec::with_capacity(2 * rounds);
    for _ in 0..rounds {
        let g = locks
            .lock_key(key.clone())
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .ctx("acquire")?;
        events.push((Ev::Acq, mono_ns()));
        hold_async(hold).await;
        events.push((Ev::Rel, mono_ns()));
        match g.release().await.ctx("release")? {
            Released::Released => {}
            other => return Err(format!("release answered {other:?}")),
        }
    }
    Ok(events)
}

/// One process's side of the pipe floor: wait for a byte (unless `first` on the first round),
/// hold, send a byte.
fn pipe_participant(
    first: bool,
    rounds: usize,
    hold: Duration,
    input: &mut impl std::io::Read,
    output: &mut impl Write,
) -> Result<Events, String> {
    let mut events = Vec::with_capacity(2 * rounds);
    let mut byte = [0u8; 1];
    for i in 0..rounds {
        if !(first && i == 0) {
            input.read_exact(&mut byte).ctx("read the turn")?;
        }
        events.push((Ev::Acq, mono_ns()));
        hold_sync(hold);
        events.push((Ev::Rel, mono_ns()));
        // A newline: the parent reads the child's event lines after the last turn and skips it.
        output.write_all(b"\n").ctx("pass the turn")?;
        output.flush().ctx("pass the turn")?;
    }
    Ok(events)
}

/// The re-executed second process: says `ready`, runs its side, prints its events on stdout.
fn child_main(mode: &str) {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| die(format!("{name} not set")));
    let rounds: usize = var("LEASEHOLD_BENCH_ROUNDS")
        .parse()
        .unwrap_or_else(|e| die(format!("LEASEHOLD_BENCH_ROUNDS: {e}")));
    let hold = Duration::from_micros(
        var("LEASEHOLD_BENCH_HOLD_US")
            .parse()
            .unwrap_or_else(|e| die(format!("LEASEHOLD_BENCH_HOLD_US: {e}"))),
    );
    let mut out = std::io::stdout().lock();
    let mut input = std::io::stdin().lock();
    let res = if mode == Mode::Pipe.name() {
        let _ = writeln!(out, "ready");
        let _ = out.flush();
        pipe_participant(false, rounds, hold, &mut input, &mut out)
    } else {
        let dir = var("LEASEHOLD_BENCH_DIR");
        let rt = current_thread();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
        let mut go = String::new();
        if input.read_line(&mut go).is_err() || go.trim() != "go" {
            die("handoff child: no go from the parent");
        }
        rt.block_on(lease_participant(Path::new(&dir), rounds, hold))
    };
    match res {
        Ok(events) => {
            for (ev, ns) in events {
                let _ = writeln!(out, "{} {ns}", if ev == Ev::Acq { "acq" } else { "rel" });
            }
            let _ = writeln!(out, "end");
        }
        Err(e) => {
            let _ = writeln!(out, "error {e}");
        }
    }
    let _ = out.flush();
}

#[derive(Debug)]
struct Handoff {
    stat: Stat,
    max_ns: f64,
    handoffs: usize,
    releases: usize,
    overlaps: usize,
}

/// Runs both sides of a handoff benchmark (this process and a re-executed child) and analyses the
/// merged event logs.
fn handoff(cfg: &Config, mode: Mode) -> Result<Handoff, String> {
    let dir = tempfile::tempdir().ctx("tempdir")?;
    let exe = std::env::current_exe().ctx("current_exe")?;
    let mut child = Command::new(exe)
        .env(CHILD_ENV, mode.name())
        .env("LEASEHOLD_BENCH_DIR", dir.path())
        .env("LEASEHOLD_BENCH_ROUNDS", cfg.handoff_rounds.to_string())
        .env(
            "LEASEHOLD_BENCH_HOLD_US",
            cfg.handoff_hold.as_micros().to_string(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ctx("spawn the second process")?;
    let res = (|| {
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("no pipes to the second process".to_owned());
        };
        let mut from_child = BufReader::new(stdout);
        let mut line = String::new();
        from_child
            .read_line(&mut line)
            .ctx("start the second process")?;
        if line.trim() != "ready" {
            return Err(format!("second process did not start: {line:?}"));
        }
        let mine = match mode {
            Mode::Lease => {
                let rt = current_thread();
                writeln!(stdin, "go").ctx("start the second process")?;
                rt.block_on(lease_participant(
                    dir.path(),
                    cfg.handoff_rounds,
                    cfg.handoff_hold,
                ))?
            }
            Mode::Pipe => pipe_participant(
                true,
                cfg.handoff_rounds,
                cfg.handoff_hold,
                &mut from_child,
                &mut stdin,
            )?,
        };
        drop(stdin);
        let mut theirs = vec![];
        for line in from_child.lines() {
            let line = line.ctx("read the second process's events")?;
            let mut parts = line.splitn(2, ' ');
            let (what, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let ev = match what {
                "" => continue,
                "acq" => Ev::Acq,
                "rel" => Ev::Rel,
                "end" => break,
                "error" => return Err(format!("second process: {rest}")),
                _ => return Err(format!("second process printed {line:?}")),
            };
            theirs.push((ev, rest.parse::<u64>().ctx("event time")?));
        }
        if theirs.len() != mine.len() {
            return Err(format!(
                "second process reported {} events, expected {}",
                theirs.len(),
                mine.len()
            ));
        }
        Ok((mine, theirs))
    })();
    let status = child.wait();
    let (mine, theirs) = res?;
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("second process exited with {s}")),
        Err(e) => return Err(format!("waiting for the second process: {e}")),
    }
    analyse(&mine, &theirs)
}

/// Merges the logs of both processes and measures every release → other process's acquisition.
fn analyse(mine: &Events, theirs: &Events) -> Result<Handoff, String> {
    let mut all: Vec<(u64, Ev, u8)> = mine
        .iter()
        .map(|&(e, t)| (t, e, 0))
        .chain(theirs.iter().map(|&(e, t)| (t, e, 1)))
        .collect();
    all.sort_by_key(|&(t, e, _)| (t, e == Ev::Acq));
    // Holds must not overlap: in the merged log every acquisition follows a release (or the start)
    // and every release follows the same process's acquisition.
    let mut overlaps = 0;
    let mut holder = None;
    for &(_, ev, p) in &all {
        match ev {
            Ev::Acq => overlaps += usize::from(holder.replace(p).is_some()),
            Ev::Rel => overlaps += usize::from(holder.take() != Some(p)),
        }
    }
    let mut lat: Vec<f64> = all
        .windows(2)
        .filter_map(|w| match w {
            [(tr, Ev::Rel, p), (ta, Ev::Acq, q)] if p != q => Some((ta - tr) as f64),
            _ => None,
        })
        .collect();
    if lat.is_empty() {
        return Err("no handoff between the processes was observed".into());
    }
    lat.sort_by(f64::total_cmp);
    if std::env::var_os("LEASEHOLD_BENCH_DEBUG").is_some() {
        let qs: Vec<String> = [0.1, 0.5, 0.9, 0.95, 0.98, 0.99, 1.0]
            .iter()
            .map(|&q| human(quantile(&lat, q)))
            .collect();
        eprintln!(
            "handoff latency q10 q50 q90 q95 q98 q99 max: {}; > 1 ms: {}",
            qs.join(" "),
            lat.iter().filter(|&&x| x > 1e6).count()
        );
    }
    Ok(Handoff {
        stat: Stat {
            median_ns: quantile(&lat, 0.5),
            p99_ns: quantile(&lat, 0.99),
            samples: lat.len(),
            batch: 1,
        },
        max_ns: lat[lat.len() - 1],
        handoffs: lat.len(),
        releases: all.len() / 2,
        overlaps,
    })
}

fn handoff_cases(cfg: &Config, report: &mut Report) {
    for (mode, id, case, floor, target) in [
        (
            Mode::Pipe,
            "pipe ping-pong",
            "cross-process wake-up floor: pipe ping-pong, same hold",
            None,
            Target::None,
        ),
        (
            Mode::Lease,
            "handoff",
            "file store cross-process handoff: release → other process holds",
            Some("pipe ping-pong"),
            Target::P99Ns(1e6),
        ),
    ] {
        let stat = handoff(cfg, mode).and_then(|h| {
            println!(
                "{case}: {} handoffs of {} releases; p50 {}, p99 {}, max {}",
                h.handoffs,
                h.releases,
                human(h.stat.median_ns),
                human(h.stat.p99_ns),
                human(h.max_ns),
            );
            if h.overlaps == 0 {
                Ok(h.stat)
            } else {
                Err(format!(
                    "{} overlapping holds: the lock is broken",
                    h.overlaps
                ))
            }
        });
        report.add(id, format!("{case} (p50, p99)"), stat, floor, target);
    }
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child_main(&mode);
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    // Positional words pick sections (`memory`, `file`, `handoff`); none picks all. Other flags
    // (cargo passes `--bench`) are ignored.
    let picked: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let run = |section: &str| picked.is_empty() || picked.contains(&section);
    let cfg = Config::new(quick);
    let started = Instant::now();
    let load_before = loadavg();
    println!(
        "leasehold locks benchmark ({} run; load average {load_before}; {} CPUs)",
        if cfg.quick { "quick" } else { "full" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!();

    let mut report = Report::default();
    let rt = current_thread();
    if run("memory") {
        in_process(&rt, &cfg, &mut report);
    }
    if run("file") {
        let dir = tempfile::tempdir().unwrap_or_else(|e| die(format!("tempdir: {e}")));
        files(&rt, &cfg, &mut report, dir.path());
    }
    if run("handoff") {
        handoff_cases(&cfg, &mut report);
    }

    let (failed, missed) = report.print_table();
    println!();
    println!(
        "{} cases, {failed} failed, {missed} targets missed; {:.1} s; load average {load_before} before, {} after",
        report.rows.len(),
        started.elapsed().as_secs_f64(),
        loadavg(),
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
