//! Prometheus metrics.

use crate::error::{Error, Result};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

/// Metric names after the prefix: attempts, successes, failures, acquisition duration, hold
/// duration, releases, renewals, lost, handoffs, local handoffs.
type Names = [&'static str; 10];

const NAMES: Names = [
    "acquire_attempts_total",
    "acquire_success_total",
    "acquire_failures_total",
    "acquire_duration_seconds",
    "hold_duration_seconds",
    "releases_total",
    "renewals_total",
    "lost_total",
    "handoffs_requested_total",
    "local_handoffs_total",
];

const LOCK_NAMES: Names = [
    "lock_acquisition_attempts_total",
    "lock_acquisition_successes_total",
    "lock_acquisition_failures_total",
    "lock_acquisition_duration_seconds",
    "lock_hold_duration_seconds",
    "lock_releases_total",
    "lock_renewals_total",
    "lock_lost_total",
    "lock_handoffs_requested_total",
    "lock_local_handoffs_total",
];

/// The metric set; cheap to clone (clones update the same metrics). See
/// [`Locks::with_metrics`](crate::Locks::with_metrics) for an example of what a lock records.
///
/// Names are `<prefix>_<name>`; the prefix is yours (default `leasehold`). Register once per
/// registry and hand the [`Metrics`] to [`crate::Locks::with_metrics`].
///
/// | metric | type | meaning |
/// |---|---|---|
/// | `acquire_attempts_total` | counter | calls of `try_acquire`/`acquire` |
/// | `acquire_success_total` | counter | leases obtained |
/// | `acquire_failures_total{reason}` | counter | `contention` (held elsewhere, wait ran out) or `store_error` |
/// | `acquire_duration_seconds` | histogram | from the call to the lease (or the failure) |
/// | `hold_duration_seconds` | histogram | from acquisition to release or loss |
/// | `releases_total` | counter | releases (explicit or on drop) |
/// | `renewals_total` | counter | successful renewals |
/// | `lost_total` | counter | leases lost (refused renewal, unreachable store until expiry) |
/// | `handoffs_requested_total` | counter | handoff signals raised by a waiter |
/// | `local_handoffs_total` | counter | leases handed to the next task of the process without a store call |
///
/// [`Metrics::register_lock_names`] registers the same metrics under the `lock_…` names that
/// services of the Kubernetes Lease locking pattern record, so that their dashboards keep working
/// (`<prefix>_lock_acquisition_attempts_total`, `_lock_acquisition_successes_total`,
/// `_lock_acquisition_failures_total{reason}`, `_lock_acquisition_duration_seconds`,
/// `_lock_hold_duration_seconds`, `_lock_releases_total`, plus `_lock_renewals_total`,
/// `_lock_lost_total`, `_lock_handoffs_requested_total`, `_lock_local_handoffs_total`).
#[derive(Debug, Clone)]
pub struct Metrics {
    pub(crate) attempts: IntCounter,
    pub(crate) successes: IntCounter,
    pub(crate) failures: IntCounterVec,
    pub(crate) acquire_seconds: Histogram,
    pub(crate) hold_seconds: Histogram,
    pub(crate) releases: IntCounter,
    pub(crate) renewals: IntCounter,
    pub(crate) lost: IntCounter,
    pub(crate) handoffs: IntCounter,
    pub(crate) local_handoffs: IntCounter,
}

impl Metrics {
    /// Creates the metrics named `<prefix>_…` and registers them in `registry`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when the prefix is not a valid metric name or the metrics are
    /// already registered there.
    ///
    /// ```
    /// let registry = prometheus::Registry::new();
    /// let m = leasehold::Metrics::register("myapp_locks", &registry).unwrap();
    /// # let _ = m;
    /// assert!(leasehold::Metrics::register("myapp_locks", &registry).is_err());
    /// assert!(matches!(
    ///     leasehold::Metrics::register("my-app", &prometheus::Registry::new()),
    ///     Err(leasehold::Error::InvalidOption { .. })
    /// ));
    /// ```
    pub fn register(prefix: &str, registry: &Registry) -> Result<Self> {
        Self::register_names(prefix, registry, &NAMES)
    }

    /// Creates the metrics under the `lock_…` names of the Kubernetes Lease locking pattern's
    /// services (`<prefix>_lock_acquisition_attempts_total` …, see the module docs) and registers
    /// them in `registry`.
    ///
    /// # Errors
    /// As [`Metrics::register`].
    ///
    /// ```
    /// let registry = prometheus::Registry::new();
    /// let m = leasehold::Metrics::register_lock_names("llm", &registry).unwrap();
    /// m.clone(); // hand it to Locks::with_metrics
    /// # let _ = m;
    /// ```
    pub fn register_lock_names(prefix: &str, registry: &Registry) -> Result<Self> {
        Self::register_names(prefix, registry, &LOCK_NAMES)
    }

    fn register_names(prefix: &str, registry: &Registry, n: &Names) -> Result<Self> {
        let e = |err: prometheus::Error| Error::option("metrics prefix", err.to_string());
        let c = |name: &str, help: &str| {
            IntCounter::with_opts(Opts::new(format!("{prefix}_{name}"), help))
        };
        let buckets = vec![
            0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0,
            3600.0,
        ];
        let m = Metrics {
            attempts: c(n[0], "Lease acquisition calls").map_err(e)?,
            successes: c(n[1], "Leases obtained").map_err(e)?,
            failures: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_{}", n[2]),
                    "Failed acquisitions by reason",
                ),
                &["reason"],
            )
            .map_err(e)?,
            acquire_seconds: Histogram::with_opts(
                HistogramOpts::new(format!("{prefix}_{}", n[3]), "Time to obtain a lease")
                    .buckets(buckets.clone()),
            )
            .map_err(e)?,
            hold_seconds: Histogram::with_opts(
                HistogramOpts::new(format!("{prefix}_{}", n[4]), "Time a lease was held")
                    .buckets(buckets),
            )
            .map_err(e)?,
            releases: c(n[5], "Leases released").map_err(e)?,
            renewals: c(n[6], "Successful renewals").map_err(e)?,
            lost: c(n[7], "Leases lost").map_err(e)?,
            handoffs: c(n[8], "Handoff requests seen by holders").map_err(e)?,
            local_handoffs: c(
                n[9],
                "Leases handed to the next task of the process without a store call",
            )
            .map_err(e)?,
        };
        registry.register(Box::new(m.attempts.clone())).map_err(e)?;
        registry
            .register(Box::new(m.successes.clone()))
            .map_err(e)?;
        registry.register(Box::new(m.failures.clone())).map_err(e)?;
        registry
            .register(Box::new(m.acquire_seconds.clone()))
            .map_err(e)?;
        registry
            .register(Box::new(m.hold_seconds.clone()))
            .map_err(e)?;
        registry.register(Box::new(m.releases.clone())).map_err(e)?;
        registry.register(Box::new(m.renewals.clone())).map_err(e)?;
        registry.register(Box::new(m.lost.clone())).map_err(e)?;
        registry.register(Box::new(m.handoffs.clone())).map_err(e)?;
        registry
            .register(Box::new(m.local_handoffs.clone()))
            .map_err(e)?;
        Ok(m)
    }

    /// The registry's metrics in the Prometheus text format (`# HELP`, `# TYPE` and one line per
    /// sample), for a `/metrics` endpoint; an encoding error is not reported. Counters show from
    /// registration, at 0; `…_failures_total` only once a failure of some reason was counted.
    ///
    /// ```
    /// use leasehold::Metrics;
    /// let registry = prometheus::Registry::new();
    /// let _m = Metrics::register_lock_names("llm", &registry)?;
    /// let text = Metrics::render(&registry);
    /// assert!(text.contains("# TYPE llm_lock_acquisition_attempts_total counter"), "{text}");
    /// assert!(text.contains("\nllm_lock_acquisition_attempts_total 0\n"), "{text}");
    /// assert!(text.contains("llm_lock_hold_duration_seconds_count 0"), "{text}");
    /// assert!(!text.contains("llm_lock_acquisition_failures_total"), "{text}");
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn render(registry: &Registry) -> String {
        use prometheus::Encoder;
        let mut buf = vec![];
        let _ = prometheus::TextEncoder::new().encode(&registry.gather(), &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}
