//! Prometheus metrics of a task queue: its depth and capacity, and what this process's workers did.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `queue_pending{priority}` | gauge | pending tasks by effective priority (`high`, `normal`, `low`), as of the last [`QueueMetrics::observe`] |
//! | `queue_running` | gauge | running tasks in the whole queue (slots used) |
//! | `queue_slots` | gauge | the global capacity the live workers enforce |
//! | `queue_workers` | gauge | live workers |
//! | `queue_keys` | gauge | keys with pending or running tasks |
//! | `queue_tasks_started_total` | counter | tasks this process started |
//! | `queue_tasks_finished_total{outcome}` | counter | tasks this process ended and recorded: `succeeded`, `failed`, `cancelled` (not one another worker recovered meanwhile) |
//! | `queue_task_wait_seconds` | histogram | from enqueue to start, for the tasks this process started |
//! | `queue_task_run_seconds` | histogram | from start to end, for the tasks this process ended |
//! | `queue_recovered_total{action}` | counter | tasks this process's recovery acted on: `requeued`, `failed`, `timed_out` |
//!
//! The gauges describe the shared queue, read with [`QueueBackend::status`](super::QueueBackend::status)
//! (the `leasehold queue work --metrics` endpoint reads it on every scrape); the counters and
//! histograms count this process's own work, so a sum over the workers is the queue's.

use super::{Outcome, Recovered, Status, Task};
use crate::error::{Error, Result};
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use std::time::Duration;

/// The queue's metric set; cheap to clone. See the [module docs](self) for the metrics.
///
/// ```
/// use leasehold::queue::{metrics::QueueMetrics, Status};
/// let registry = prometheus::Registry::new();
/// let m = QueueMetrics::register("myapp", &registry).unwrap();
/// m.observe(&Status { running: 2, slots: 4, ..Status::default() });
/// assert!(leasehold::Metrics::render(&registry).contains("myapp_queue_slots 4"));
/// ```
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    pending: IntGaugeVec,
    running: IntGauge,
    slots: IntGauge,
    workers: IntGauge,
    keys: IntGauge,
    started: IntCounter,
    finished: IntCounterVec,
    wait_seconds: Histogram,
    run_seconds: Histogram,
    recovered: IntCounterVec,
}

impl QueueMetrics {
    /// Creates the metrics named `<prefix>_queue_…` and registers them in `registry`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when the prefix is not a valid metric name or the metrics are
    /// already registered there.
    pub fn register(prefix: &str, registry: &Registry) -> Result<Self> {
        let e = |err: prometheus::Error| Error::option("metrics prefix", err.to_string());
        let name = |n: &str| format!("{prefix}_queue_{n}");
        let gauge = |n: &str, help: &str| IntGauge::with_opts(Opts::new(name(n), help));
        let seconds = |n: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name(n), help).buckets(vec![
                0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0,
            ]))
        };
        let m = QueueMetrics {
            pending: IntGaugeVec::new(
                Opts::new(name("pending"), "Pending tasks by effective priority"),
                &["priority"],
            )
            .map_err(e)?,
            running: gauge("running", "Running tasks in the queue (slots used)").map_err(e)?,
            slots: gauge("slots", "The global capacity the live workers enforce").map_err(e)?,
            workers: gauge("workers", "Live workers").map_err(e)?,
            keys: gauge("keys", "Keys with pending or running tasks").map_err(e)?,
            started: IntCounter::with_opts(Opts::new(
                name("tasks_started_total"),
                "Tasks this process started",
            ))
            .map_err(e)?,
            finished: IntCounterVec::new(
                Opts::new(
                    name("tasks_finished_total"),
                    "Tasks this process ended, by outcome",
                ),
                &["outcome"],
            )
            .map_err(e)?,
            wait_seconds: seconds("task_wait_seconds", "Time from enqueue to start").map_err(e)?,
            run_seconds: seconds("task_run_seconds", "Time from start to end").map_err(e)?,
            recovered: IntCounterVec::new(
                Opts::new(
                    name("recovered_total"),
                    "Tasks this process's recovery acted on, by action",
                ),
                &["action"],
            )
            .map_err(e)?,
        };
        let all: [Box<dyn prometheus::core::Collector>; 10] = [
            Box::new(m.pending.clone()),
            Box::new(m.running.clone()),
            Box::new(m.slots.clone()),
            Box::new(m.workers.clone()),
            Box::new(m.keys.clone()),
            Box::new(m.started.clone()),
            Box::new(m.finished.clone()),
            Box::new(m.wait_seconds.clone()),
            Box::new(m.run_seconds.clone()),
            Box::new(m.recovered.clone()),
        ];
        for c in all {
            registry.register(c).map_err(e)?;
        }
        Ok(m)
    }

    /// Sets the queue-wide gauges from `status`.
    pub fn observe(&self, status: &Status) {
        let set = |g: &IntGauge, v: u64| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        for (priority, n) in [
            ("high", status.pending.high),
            ("normal", status.pending.normal),
            ("low", status.pending.low),
        ] {
            set(&self.pending.with_label_values(&[priority]), n);
        }
        set(&self.running, status.running);
        set(&self.slots, status.slots);
        set(&self.workers, status.workers.len() as u64);
        set(&self.keys, status.keys_total);
    }

    /// Counts `task` started; its wait from enqueue to start is observed without comparing two
    /// machines' clocks: `task` is as [claimed](super::QueueBackend::claim), its `started_ms` the
    /// claim's time on the queue's clock (the one its `enqueued_ms` was read with: PostgreSQL's;
    /// a SQLite queue's writers share one machine's), and `since_claim` is how long it then took to start (waiting for its
    /// key's lease), measured here. A task without a claim time counts `since_claim` alone.
    pub fn started(&self, task: &Task, since_claim: Duration) {
        self.started.inc();
        let queued = task
            .started_ms
            .map_or(0, |claimed| claimed.saturating_sub(task.enqueued_ms));
        let waited = Duration::from_millis(queued) + since_claim;
        self.wait_seconds.observe(waited.as_secs_f64());
    }

    /// Counts a task ended with `outcome`, after running for `ran` (`None`: ended before it
    /// started, e.g. cancelled while waiting for its key's lease; no run time is observed). Call
    /// it once [`QueueBackend::finish`](super::QueueBackend::finish) answered `true`: a task it
    /// answers `false` for was recovered by another worker, which counts it.
    pub fn finished(&self, outcome: &Outcome, ran: Option<Duration>) {
        let label = match outcome {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed(_) => "failed",
            Outcome::Cancelled(_) => "cancelled",
        };
        self.finished.with_label_values(&[label]).inc();
        if let Some(ran) = ran {
            self.run_seconds.observe(ran.as_secs_f64());
        }
    }

    /// Counts what a [`recover`](super::QueueBackend::recover) call did.
    pub fn recovered(&self, r: &Recovered) {
        for (action, n) in [
            ("requeued", r.requeued.len()),
            ("failed", r.failed.len()),
            ("timed_out", r.timed_out.len()),
        ] {
            self.recovered.with_label_values(&[action]).inc_by(n as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::PendingCounts;

    #[test]
    fn gauges_follow_the_status_and_counters_this_process() {
        let registry = Registry::new();
        let m = QueueMetrics::register("t", &registry).unwrap();
        m.observe(&Status {
            pending: PendingCounts {
                high: 1,
                normal: 5,
                low: 0,
            },
            running: 3,
            slots: 4,
            keys_total: 7,
            ..Status::default()
        });
        m.finished(&Outcome::Succeeded, Some(Duration::from_millis(20)));
        m.finished(
            &Outcome::Cancelled("timed out".into()),
            Some(Duration::from_secs(1)),
        );
        m.finished(&Outcome::Failed("corrupt payload".into()), None);
        m.recovered(&Recovered {
            requeued: vec![1, 2],
            ..Recovered::default()
        });
        let text = crate::metrics::Metrics::render(&registry);
        for line in [
            "t_queue_pending{priority=\"high\"} 1",
            "t_queue_pending{priority=\"normal\"} 5",
            "t_queue_running 3",
            "t_queue_slots 4",
            "t_queue_keys 7",
            "t_queue_workers 0",
            "t_queue_tasks_finished_total{outcome=\"succeeded\"} 1",
            "t_queue_tasks_finished_total{outcome=\"cancelled\"} 1",
            "t_queue_tasks_finished_total{outcome=\"failed\"} 1",
            "t_queue_tasks_finished_total{outcome=\"failed\"} 1",
            "t_queue_task_run_seconds_count 2",
            "t_queue_recovered_total{action=\"requeued\"} 2",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // Enqueued at 1 s and claimed at 3 s by the queue's clock, started 0.5 s after the claim.
        let task = Task {
            id: 1,
            key: "k".into(),
            group: None,
            priority: crate::queue::Priority::Normal,
            effective: crate::queue::Priority::Normal,
            payload: String::new(),
            state: crate::queue::TaskState::Running,
            policy: crate::queue::Policy::AtMostOnce,
            attempts: 1,
            timeout_ms: None,
            enqueued_ms: 1_000,
            started_ms: Some(3_000),
            ended_ms: None,
            worker: None,
            fence: None,
            lease_expires_ms: None,
            cancel: None,
            detail: None,
        };
        m.started(&task, Duration::from_millis(500));
        let text = crate::metrics::Metrics::render(&registry);
        assert!(text.contains("t_queue_task_wait_seconds_sum 2.5"), "{text}");
        assert!(text.contains("t_queue_tasks_started_total 1"), "{text}");
        assert!(QueueMetrics::register("t", &registry).is_err());
        assert!(QueueMetrics::register("bad prefix", &Registry::new()).is_err());
    }
}
