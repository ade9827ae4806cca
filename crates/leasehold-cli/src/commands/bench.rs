//! `leasehold bench`: how fast leases come and go on a store, measured from here. Acquire+release
//! cycles per second and their latency with N tasks on distinct keys, and a hot key: N tasks
//! taking turns on one key, with how long each waited. Every task talks to the store as a
//! separate process would (the in-process layer is off).
//!
//! Keys are `leasehold-bench/PID-MS/…`; every lease is released before the command returns (the
//! records of stores that keep them, like the file store, stay: `cleanup` removes them).

use super::bench_plot;
use crate::cli::BenchArgs;
use crate::exit::{Failure, OK};
use crate::output::{self, print};
use crate::process::signals::Forwarded;
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
    let runs = args.tasks.len() * if args.no_hot { 1 } else { 2 };
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
            let measured = tokio::select! {
                m = measure(&locks, &run, tasks, hot, args.duration) => m?,
                sig = signals.recv() => {
                    locks.release_all().await.ok();
                    return Err(Failure::new(
                        crate::process::child::signal_status(sig.signal),
                        format!("{} received: bench stopped", crate::process::signals::name(sig.signal)),
                    ));
                }
            };
            rows.push((tasks, hot, measured));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    if let Some(path) = &args.plot {
        let runs: Vec<bench_plot::Run<'_>> = rows
            .iter()
            .map(|(tasks, hot, m)| bench_plot::Run {
                tasks: *tasks,
                hot: *hot,
                rate: m.rate(),
                latencies: &m.latencies,
            })
            .collect();
        bench_plot::draw(path, &described, &runs)?;
    }
    if args.json {
        let runs: Vec<serde_json::Value> = rows
            .iter()
            .map(|(tasks, hot, m)| {
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                json!({
                    "tasks": tasks,
                    "keys": if *hot { "one" } else { "distinct" },
                    "per_second": m.rate(),
                    "count": m.done,
                    "p50_ms": ms(m.quantile(0.5)),
                    "p99_ms": ms(m.quantile(0.99)),
                    "p999_ms": ms(m.quantile(0.999)),
                    "max_ms": ms(m.quantile(1.0)),
                })
            })
            .collect();
        print(&format!(
            "{}\n",
            json!({"store": described, "duration_ms": args.duration.as_millis() as u64, "runs": runs})
        ))?;
        return Ok(OK);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|(tasks, hot, m)| {
            vec![
                tasks.to_string(),
                if *hot { "one (hot)" } else { "distinct" }.into(),
                format!("{:.0}", m.rate()),
                latency(m.quantile(0.5)),
                latency(m.quantile(0.99)),
                latency(m.quantile(0.999)),
                latency(m.quantile(1.0)),
            ]
        })
        .collect();
    let mut text = format!(
        "{described}: acquire+release cycles (distinct keys) and handoffs (one key), {} per run\n\n",
        output::duration(args.duration)
    );
    text.push_str(&output::table(
        &["TASKS", "KEYS", "PER SECOND", "P50", "P99", "P99.9", "MAX"],
        &table,
    ));
    print(&text)?;
    Ok(OK)
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
    let mut latencies = vec![];
    for h in handles {
        let got = h
            .await
            .map_err(|e| Failure::error(format!("a bench task failed: {e}")))?;
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
