//! `leasehold bench`: how fast leases come and go on a store, measured from here. Acquire+release
//! cycles per second and their latency with N tasks on distinct keys, and a hot key: N tasks
//! taking turns on one key, with how long each waited. Every task talks to the store as a
//! separate process would (the in-process layer is off).
//!
//! Keys are `leasehold-bench/PID-MS/…`; every lease is released before the command returns (the
//! records of stores that keep them, like the file store, stay: `cleanup` removes them).
//!
//! `--floor` runs the store's floor ([`leasehold::floor::Floor`]) beside every row, with the same
//! tasks for the same time on keys of its own (`…/floor-…`): uncontended cycles beside the
//! distinct-key rows, a contended take and release beside the hot-key rows (a contender that
//! finds the key taken tries again at once), and prints the ratio leasehold / floor, with the
//! requests per cycle or handoff where the store's transport counts them.

use super::bench_plot;
use crate::cli::BenchArgs;
use crate::exit::{Failure, OK};
use crate::output::{self, print};
use crate::process::signals::Forwarded;
use leasehold::floor::Floor;
use leasehold::{Key, LockStore, Locks};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one run measured.
struct Measured {
    /// Completed cycles (distinct keys) or handoffs (hot key).
    done: usize,
    elapsed: Duration,
    /// Per cycle (distinct keys) or per wait (hot key), sorted.
    latencies: Vec<Duration>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile (0..=1) of the latencies.
    fn quantile(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[i.min(self.latencies.len() - 1)]
    }
}

/// One row: a run of leasehold and, with `--floor`, of the floor beside it.
struct Row {
    tasks: usize,
    hot: bool,
    leasehold: Measured,
    /// Requests per cycle or handoff, where the store's transport counts them.
    requests: Option<f64>,
    floor: Option<(Measured, Option<f64>)>,
}

impl Row {
    /// leasehold's rate over the floor's.
    fn ratio(&self) -> Option<f64> {
        let (floor, _) = self.floor.as_ref()?;
        ratio(self.leasehold.rate(), floor.rate())
    }
}

/// `a / b`, or `None` when `b` measured nothing (no ratio to give).
fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

/// Requests per operation: `requests` sent over `done` operations, `None` without operations.
fn per_op(requests: u64, done: usize) -> Option<f64> {
    (done > 0).then(|| requests as f64 / done as f64)
}

/// `leasehold bench`.
pub(crate) async fn bench(store: Arc<dyn LockStore>, args: BenchArgs) -> Result<u8, Failure> {
    // A plot that cannot be written fails before the runs, not after them.
    if let Some(path) = &args.plot {
        std::fs::File::create(path)
            .map_err(|e| Failure::error(format!("cannot draw {}: {e}", path.display())))?;
    }
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let described = leasehold::redact_url(&store.describe());
    let floor = match (args.floor, store.floor()) {
        (false, _) => None,
        (true, Some(floor)) => Some(floor),
        (true, None) => {
            print(&format!(
                "{described}: this store has no floor to measure against (--floor)\n"
            ))?;
            return Ok(OK);
        }
    };
    // Every task goes to the store, as separate processes would: the in-process layer would hand
    // a hot key over between this process's tasks without it.
    let locks = Locks::from_arc(store).with_local_layer(false);
    // This process and the time: a run's keys are its own.
    let run = format!(
        "leasehold-bench/{}-{}",
        std::process::id(),
        leasehold::now_ms()
    );
    let mut rows = vec![];
    let runs =
        args.tasks.len() * if args.no_hot { 1 } else { 2 } * if floor.is_some() { 2 } else { 1 };
    let bar = crate::progress::bar(
        u64::try_from(runs).unwrap_or(u64::MAX),
        "[{bar:20}] {pos}/{len} rows  {msg}",
        !args.json,
    );
    for &tasks in &args.tasks {
        for hot in [false, true] {
            if hot && args.no_hot {
                continue;
            }
            bar.set_message(format!(
                "{tasks} task{} {} for {}",
                if tasks == 1 { "" } else { "s" },
                if hot {
                    "on one key"
                } else {
                    "on keys of their own"
                },
                humantime::format_duration(args.duration)
            ));
            let sent = floor.as_ref().and_then(|f| f.requests());
            let leasehold = tokio::select! {
                m = measure(&locks, &run, tasks, hot, args.duration) => m?,
                sig = signals.recv() => return Err(stopped(&locks, sig.signal).await),
            };
            let requests = requests_per_op(floor.as_deref(), sent, leasehold.done);
            bar.inc(1);
            let floor = match &floor {
                None => None,
                Some(f) => {
                    let sent = f.requests();
                    let m = tokio::select! {
                        m = measure_floor(f, &run, tasks, hot, args.duration) => m?,
                        sig = signals.recv() => return Err(stopped(&locks, sig.signal).await),
                    };
                    let requests = requests_per_op(Some(&**f), sent, m.done);
                    bar.inc(1);
                    Some((m, requests))
                }
            };
            rows.push(Row {
                tasks,
                hot,
                leasehold,
                requests,
                floor,
            });
        }
    }
    bar.finish_and_clear();
    if let Some(path) = &args.plot {
        let runs: Vec<bench_plot::Run<'_>> = rows
            .iter()
            .map(|r| bench_plot::Run {
                tasks: r.tasks,
                hot: r.hot,
                rate: r.leasehold.rate(),
                latencies: &r.leasehold.latencies,
            })
            .collect();
        bench_plot::draw(path, &described, &runs)?;
    }
    let counted = floor.as_ref().is_some_and(|f| f.requests().is_some());
    if args.json {
        let runs: Vec<serde_json::Value> = rows.iter().map(|r| run_json(r, counted)).collect();
        let mut all = json!({"store": described, "duration_ms": args.duration.as_millis() as u64, "runs": runs});
        if let Some(f) = &floor {
            all["floor"] = f.describe().into();
        }
        print(&format!("{all}\n"))?;
        return Ok(OK);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let m = &r.leasehold;
            let mut row = vec![
                r.tasks.to_string(),
                if r.hot { "one (hot)" } else { "distinct" }.into(),
                format!("{:.0}", m.rate()),
                latency(m.quantile(0.5)),
                latency(m.quantile(0.99)),
                latency(m.quantile(0.999)),
                latency(m.quantile(1.0)),
            ];
            if let Some((f, f_requests)) = &r.floor {
                row.push(format!("{:.0}", f.rate()));
                row.push(r.ratio().map_or("-".into(), |x| format!("{x:.2}")));
                if counted {
                    row.push(requests(r.requests));
                    row.push(requests(*f_requests));
                }
            }
            row
        })
        .collect();
    let mut text = format!(
        "{described}: acquire+release cycles (distinct keys) and handoffs (one key), {} per run\n",
        output::duration(args.duration)
    );
    let mut header = vec!["TASKS", "KEYS", "PER SECOND", "P50", "P99", "P99.9", "MAX"];
    if let Some(f) = &floor {
        text.push_str(&format!(
            "floor: {}\nRATIO: leasehold's per second / the floor's{}\n",
            f.describe(),
            if counted {
                "; REQ/OP: requests per cycle or handoff"
            } else {
                ""
            }
        ));
        header.extend(["FLOOR/S", "RATIO"]);
        if counted {
            header.extend(["REQ/OP", "FLOOR REQ/OP"]);
        }
    }
    text.push('\n');
    text.push_str(&output::table(&header, &table));
    print(&text)?;
    Ok(OK)
}

/// A row as `--json` gives it; with `--floor`, the floor's figures and the ratio beside.
fn run_json(r: &Row, counted: bool) -> serde_json::Value {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let figures = |m: &Measured| {
        json!({
            "per_second": m.rate(),
            "count": m.done,
            "p50_ms": ms(m.quantile(0.5)),
            "p99_ms": ms(m.quantile(0.99)),
            "p999_ms": ms(m.quantile(0.999)),
            "max_ms": ms(m.quantile(1.0)),
        })
    };
    let mut v = figures(&r.leasehold);
    v["tasks"] = r.tasks.into();
    v["keys"] = if r.hot { "one" } else { "distinct" }.into();
    if let Some((f, f_requests)) = &r.floor {
        let mut floor = figures(f);
        if counted {
            floor["requests_per_op"] = json!(f_requests);
            v["requests_per_op"] = json!(r.requests);
        }
        v["floor"] = floor;
        v["ratio"] = json!(r.ratio());
    }
    v
}

/// Requests per operation for the table: `2.00`, or `-` where unknown.
fn requests(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}"))
}

/// The requests per operation of a run of `done` operations that started when the floor's
/// transport had sent `sent` (both counted by the same transport), where it counts them.
fn requests_per_op(floor: Option<&dyn Floor>, sent: Option<u64>, done: usize) -> Option<f64> {
    let now = floor?.requests()?;
    per_op(now.saturating_sub(sent?), done)
}

/// A signal stopped the runs: what is held is released, and the exit says which signal.
async fn stopped(locks: &Locks, signal: i32) -> Failure {
    locks.release_all().await.ok();
    Failure::new(
        crate::process::child::signal_status(signal),
        format!(
            "{} received: bench stopped",
            crate::process::signals::name(signal)
        ),
    )
}

/// A latency: `0.16ms`, `4.3ms`, `1.25s`.
fn latency(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 1.0 {
        format!("{ms:.2}ms")
    } else if ms < 1000.0 {
        format!("{ms:.1}ms")
    } else {
        format!("{:.2}s", ms / 1e3)
    }
}

/// Runs `tasks` tasks for `duration`: each takes and releases its own key (`hot`: all wait for
/// one key, and the latency is the wait).
async fn measure(
    locks: &Locks,
    run: &str,
    tasks: usize,
    hot: bool,
    duration: Duration,
) -> Result<Measured, Failure> {
    let started = Instant::now();
    let until = started + duration;
    let mut handles = vec![];
    for t in 0..tasks {
        let key = if hot {
            format!("{run}/hot-{tasks}")
        } else {
            format!("{run}/{tasks}-{t}")
        };
        let key = Key::new(key)?;
        let locks = locks.clone();
        handles.push(tokio::spawn(async move {
            let mut latencies = vec![];
            while Instant::now() < until {
                let t0 = Instant::now();
                let builder = locks.lock_key(key.clone()).ttl(Duration::from_secs(10));
                let guard = if hot {
                    builder.wait(Duration::from_secs(30)).acquire().await?
                } else {
                    match builder.try_acquire().await? {
                        Some(g) => g,
                        None => continue,
                    }
                };
                let waited = t0.elapsed();
                guard.release().await?;
                latencies.push(if hot { waited } else { t0.elapsed() });
            }
            Ok::<_, leasehold::Error>(latencies)
        }));
    }
    collect(handles, started, "bench").await
}

/// Runs the floor as [`measure`] runs leasehold, on keys of its own: `tasks` tasks each cycling
/// its own key (`hot`: all taking turns on one key, each trying again at once when it finds it
/// taken; the latency is the wait).
async fn measure_floor(
    floor: &Arc<dyn Floor>,
    run: &str,
    tasks: usize,
    hot: bool,
    duration: Duration,
) -> Result<Measured, Failure> {
    let started = Instant::now();
    let until = started + duration;
    let mut handles = vec![];
    for t in 0..tasks {
        let key = if hot {
            format!("{run}/floor-hot-{tasks}")
        } else {
            format!("{run}/floor-{tasks}-{t}")
        };
        let key = Key::new(key)?;
        let floor = floor.clone();
        handles.push(tokio::spawn(async move {
            let mut latencies = vec![];
            'cycles: while Instant::now() < until {
                let t0 = Instant::now();
                if !hot {
                    floor.cycle(&key).await?;
                    latencies.push(t0.elapsed());
                    continue;
                }
                let taken = loop {
                    if let Some(taken) = floor.take(&key).await? {
                        break taken;
                    }
                    if Instant::now() >= until {
                        break 'cycles;
                    }
                    tokio::task::yield_now().await;
                };
                latencies.push(t0.elapsed());
                floor.release(&key, taken).await?;
            }
            Ok::<_, leasehold::Error>(latencies)
        }));
    }
    collect(handles, started, "floor").await
}

/// The latencies of `handles`' tasks (`what` tasks, for messages), started at `started`.
async fn collect(
    handles: Vec<tokio::task::JoinHandle<Result<Vec<Duration>, leasehold::Error>>>,
    started: Instant,
    what: &str,
) -> Result<Measured, Failure> {
    let mut latencies = vec![];
    for h in handles {
        let got = h
            .await
            .map_err(|e| Failure::error(format!("a {what} task failed: {e}")))?;
        latencies.extend(got?);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Measured {
        done: latencies.len(),
        elapsed,
        latencies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_need_a_floor_that_measured_something() {
        assert_eq!(ratio(500.0, 1000.0), Some(0.5));
        assert_eq!(ratio(1500.0, 1000.0), Some(1.5));
        assert_eq!(ratio(0.0, 1000.0), Some(0.0));
        assert_eq!(ratio(500.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 10.0), None);
        assert_eq!(ratio(10.0, f64::INFINITY), None);
    }

    #[test]
    fn requests_per_operation() {
        assert_eq!(per_op(20, 10), Some(2.0));
        assert_eq!(per_op(3, 2), Some(1.5));
        assert_eq!(per_op(5, 0), None);
        assert_eq!(requests(Some(2.0)), "2.00");
        assert_eq!(requests(None), "-");
    }

    #[test]
    fn a_row_with_its_floor() {
        let m = |done: usize, ms: u64| Measured {
            done,
            elapsed: Duration::from_millis(ms),
            latencies: vec![Duration::from_millis(1); done],
        };
        let row = Row {
            tasks: 2,
            hot: false,
            leasehold: m(90, 1000),
            requests: Some(2.0),
            floor: Some((m(100, 1000), Some(2.0))),
        };
        let r = row.ratio().unwrap();
        assert!((r - 0.9).abs() < 1e-9, "{r}");
        let v = run_json(&row, true);
        assert_eq!(v["keys"], "distinct");
        assert_eq!(v["floor"]["count"], 100);
        assert_eq!(v["requests_per_op"], 2.0);
        assert!((v["ratio"].as_f64().unwrap() - 0.9).abs() < 1e-9, "{v}");
        let v = run_json(&Row { floor: None, ..row }, false);
        assert!(v.get("floor").is_none() && v.get("ratio").is_none(), "{v}");
    }
}
