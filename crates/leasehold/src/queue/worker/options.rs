//! The options of a [`Worker`](super::Worker), every default stated: one value that the
//! `leasehold queue work` command, the Python package and Rust services fill in.

use crate::error::{Error, Result};
use std::time::Duration;

/// The shortest TTL a worker accepts: its heartbeat runs every TTL/3.
const MIN_TTL: Duration = Duration::from_millis(30);

/// A queue worker's options ([`Worker::options`](super::Worker::options), or one setter each on
/// [`Worker`](super::Worker)). They are checked ([`validate`](Self::validate)) when the worker
/// runs.
///
/// ```
/// use leasehold::queue::worker::WorkerOptions;
/// use std::time::Duration;
/// let mut o = WorkerOptions::default();
/// assert_eq!((o.slots, o.group_limit, o.ttl), (4, None, Duration::from_secs(30)));
/// assert_eq!(o.lease_wait_period(), Duration::from_secs(60)); // 2 × ttl
/// assert_eq!((o.aging, o.drain_timeout, o.stop_grace), (
///     Duration::from_secs(60), Duration::from_secs(30), Duration::from_secs(10)));
/// assert_eq!((o.cleanup_after, o.exit_when_idle), (None, false));
/// assert!(o.validate().is_ok());
/// o.slots = 0;
/// assert!(matches!(o.validate(), Err(leasehold::Error::InvalidOption { name: "slots", .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// The global capacity (default 4, at least 1): no task is claimed while this many run in
    /// the whole queue, and this worker runs at most this many at once.
    pub slots: u32,
    /// At most this many running tasks per group, in the whole queue (default: no limit; at
    /// least 1).
    pub group_limit: Option<u32>,
    /// The TTL of the key leases and of this worker's claims (default 30 s, at least 30 ms);
    /// both are renewed every TTL/3. A worker that dies has its tasks recovered once its claims
    /// have lapsed, a TTL after its last heartbeat.
    pub ttl: Duration,
    /// How long a claimed task may wait for its key's lease (held by a dead worker until its
    /// TTL) before it goes back to the queue (default: twice the TTL,
    /// [`lease_wait_period`](Self::lease_wait_period)).
    pub lease_wait: Option<Duration>,
    /// A pending task gains one priority level per `aging` of waiting (default a minute).
    pub aging: Duration,
    /// After [`Shutdown::drain`](super::Shutdown::drain), how long running tasks may still
    /// finish before they are told to stop (default 30 s).
    pub drain_timeout: Duration,
    /// How long a runner told to stop may take to return before the worker drops it (default
    /// 10 s). A process runner sets it above its own bound on stopping the process. Not for a
    /// stop for the key's lease: a runner is dropped at its
    /// [`RunningTask::deadline`](super::RunningTask::deadline) then.
    pub stop_grace: Duration,
    /// Deletes the tasks that ended at least this long ago
    /// ([`QueueBackend::cleanup`](crate::queue::QueueBackend::cleanup)): at start, then every
    /// hour (every `cleanup_after` if shorter, at least a second apart), on a task of its own so
    /// that a long cleanup holds up no claim or heartbeat (default: no cleanup).
    pub cleanup_after: Option<Duration>,
    /// Whether [`run`](super::Worker::run) returns once this worker runs nothing and the whole
    /// queue has nothing pending or running (default `false`).
    pub exit_when_idle: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            slots: 4,
            group_limit: None,
            ttl: Duration::from_secs(30),
            lease_wait: None,
            aging: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(30),
            stop_grace: Duration::from_secs(10),
            cleanup_after: None,
            exit_when_idle: false,
        }
    }
}

impl WorkerOptions {
    /// The lease wait in effect: `lease_wait`, else twice the TTL.
    pub fn lease_wait_period(&self) -> Duration {
        self.lease_wait.unwrap_or(self.ttl * 2)
    }

    /// Checks that the options can work.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a TTL under 30 ms, or zero slots or group limit.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < MIN_TTL {
            return Err(Error::option("ttl", "must be at least 30ms"));
        }
        if self.slots == 0 {
            return Err(Error::option("slots", "must be at least 1"));
        }
        if self.group_limit == Some(0) {
            return Err(Error::option("group_limit", "must be at least 1"));
        }
        Ok(())
    }
}
