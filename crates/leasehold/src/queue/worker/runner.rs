//! The runner's side of a worker: the [`TaskRunner`] trait, the [`RunningTask`] it is handed,
//! and the [`TaskStop`] it is told to stop for.

use crate::queue::{Outcome, Task};
use crate::store::LostReason;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;

/// What runs a claimed task, once its key's lease is held.
///
/// Any `Fn(RunningTask) -> impl Future<Output = Outcome>` closure is one: `|task| async move
/// { … }`. Implement the trait for [`check`](Self::check) too.
///
/// # Contract
/// - When [`run`](Self::run) returns, nothing the task started may still act under its key's
///   lease: the worker records the outcome and then releases the lease, and the key's next task
///   may start at once.
/// - When [`RunningTask::stopped`] completes, stop the work and return. When the reason is
///   [`TaskStop::LeaseLost`], everything the task started must be gone by
///   [`RunningTask::deadline`] (the key's lease's `valid_until`, or at once when the store said
///   the lease is gone): another worker may be granted the key then. A runner still running at
///   the lease's `valid_until` is dropped; for any other reason, [`Worker::stop_grace`](super::Worker::stop_grace) after it
///   was told to stop (see the [worker's docs](super#stopping-a-task)).
/// - A panic in `run` fails the task (the panic is caught); the worker goes on.
pub trait TaskRunner: Send + Sync + 'static {
    /// Checks a claimed task before its key's lease is taken (e.g. that its payload parses).
    /// `Err(why)` ends the task as [`Outcome::Failed`]`(why)` without running it, and the
    /// worker reports `why`. The default accepts every task.
    ///
    /// # Errors
    /// Why the task cannot run.
    fn check(&self, task: &Task) -> std::result::Result<(), String> {
        let _ = task;
        Ok(())
    }

    /// Runs `task` to its end and answers how it ended (recorded with
    /// [`QueueBackend::finish`](crate::queue::QueueBackend::finish)).
    fn run(&self, task: RunningTask) -> impl Future<Output = Outcome> + Send;
}

impl<F, Fut> TaskRunner for F
where
    F: Fn(RunningTask) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send,
{
    fn run(&self, task: RunningTask) -> impl Future<Output = Outcome> + Send {
        self(task)
    }
}

/// Why a runner must stop its task now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskStop {
    /// An operator cancelled the task ([`QueueBackend::cancel`](crate::queue::QueueBackend::cancel)).
    Cancelled,
    /// The task ran past its timeout (counted by its worker from its start, and by the queue's
    /// recovery).
    Timeout,
    /// The worker shuts down: the drain timeout passed, or [`Shutdown::stop`](super::Shutdown::stop) was called.
    Shutdown,
    /// The key's lease must be given up: its renewals have failed until its stop-by deadline
    /// (the reason is then [`LostReason::Unreachable`], and the lease is still valid until
    /// [`RunningTask::deadline`]), or it was lost (expired unrenewed, taken over, force-released:
    /// the deadline is now). The task is about to be, or already is, no longer the key's only
    /// one: stop at once, and be gone by [`RunningTask::deadline`].
    LeaseLost(LostReason),
}

impl TaskStop {
    /// The outcome to record for a task stopped for this reason: cancelled (`"cancelled"`,
    /// `"timed out"`, `"stopped: the worker was shutting down"`), or failed for a lost lease.
    ///
    /// ```
    /// use leasehold::queue::{worker::TaskStop, Outcome};
    /// assert_eq!(TaskStop::Timeout.outcome(), Outcome::Cancelled("timed out".into()));
    /// let lost = TaskStop::LeaseLost(leasehold::LostReason::Expired).outcome();
    /// assert!(matches!(lost, Outcome::Failed(why) if why.starts_with("the key's lease was lost")));
    /// ```
    pub fn outcome(&self) -> Outcome {
        match self {
            TaskStop::Cancelled => Outcome::Cancelled("cancelled".into()),
            TaskStop::Timeout => Outcome::Cancelled("timed out".into()),
            TaskStop::Shutdown => {
                Outcome::Cancelled("stopped: the worker was shutting down".into())
            }
            TaskStop::LeaseLost(reason) => {
                Outcome::Failed(format!("the key's lease was lost: {reason}"))
            }
        }
    }
}

impl fmt::Display for TaskStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskStop::Cancelled => f.write_str("cancelled"),
            TaskStop::Timeout => f.write_str("timed out"),
            TaskStop::Shutdown => f.write_str("the worker shuts down"),
            TaskStop::LeaseLost(reason) => write!(f, "the key's lease was lost: {reason}"),
        }
    }
}

/// A task a [`TaskRunner`] runs: the task, its lease's fence, and the signal to stop.
#[derive(Debug)]
pub struct RunningTask {
    task: Task,
    fence: u64,
    worker: Arc<str>,
    stop: watch::Receiver<Option<TaskStop>>,
    deadline: watch::Receiver<Option<Instant>>,
    valid_until: watch::Receiver<Instant>,
}

impl RunningTask {
    pub(super) fn new(
        task: Task,
        fence: u64,
        worker: Arc<str>,
        stop: watch::Receiver<Option<TaskStop>>,
        deadline: watch::Receiver<Option<Instant>>,
        valid_until: watch::Receiver<Instant>,
    ) -> Self {
        RunningTask {
            task,
            fence,
            worker,
            stop,
            deadline,
            valid_until,
        }
    }

    /// The task as claimed, its [`fence`](Task::fence) set.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The fence of the key's lease held for this run: strictly greater than that of any
    /// earlier run of the key. Pass it with every write the task makes, for the target to refuse
    /// a write with a lower fence than it has seen.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The worker's name: the holder id of the key's lease.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// Completes when the task must stop, with why; at once if it was told to already. Also
    /// completes ([`TaskStop::Shutdown`]) if the worker is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: call it again (or from several places) to wait again.
    pub async fn stopped(&self) -> TaskStop {
        let mut stop = self.stop.clone();
        let why = match stop.wait_for(Option::is_some).await {
            Ok(why) => why.clone(),
            Err(_) => None,
        };
        why.unwrap_or(TaskStop::Shutdown)
    }

    /// Why the task must stop, if it was told to: the non-waiting form of
    /// [`stopped`](Self::stopped).
    pub fn stop_reason(&self) -> Option<TaskStop> {
        self.stop.borrow().clone()
    }

    /// By when the task must be gone, once the key's lease must be given up (on this process's
    /// monotonic clock); `None` while the lease is healthy. Set when the lease's stop-by deadline
    /// passes without a renewal (then the lease's `valid_until`: the time up to which it is surely
    /// still this worker's, [`LeaseGuard::valid_until`](crate::LeaseGuard::valid_until)), and
    /// moved to the moment the store says the lease is gone. [`stopped`](Self::stopped) completes
    /// with [`TaskStop::LeaseLost`] then, unless the task was told to stop for another reason
    /// first; either way the worker drops a runner still running at the lease's `valid_until`
    /// (this deadline, or later when the store said the lease is gone: time for a runner that
    /// killed its work at once to see it gone).
    ///
    /// A runner that starts processes gives them the time left (SIGTERM now, SIGKILL a margin
    /// before the deadline), so that they are gone before another worker can be granted the key.
    pub fn deadline(&self) -> Option<Instant> {
        *self.deadline.borrow()
    }

    /// The time up to which the key's lease is surely this worker's, on this process's monotonic
    /// clock ([`LeaseGuard::valid_until`](crate::LeaseGuard::valid_until)): moved by each renewal.
    /// For a watchdog outside the worker's process (a paused worker cannot stop its task).
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.borrow()
    }

    /// Completes with the new [`valid_until`](Self::valid_until) once a renewal moved it past
    /// `after`; never once the lease stops moving (lost, released, or the worker gone).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn valid_until_changed(&self, after: Instant) -> Instant {
        let mut rx = self.valid_until.clone();
        let changed = match rx.wait_for(|v| *v > after).await {
            Ok(v) => Some(*v),
            Err(_) => None,
        };
        match changed {
            Some(v) => v,
            None => std::future::pending().await,
        }
    }

    /// Completes with [`deadline`](Self::deadline) once it is set or moved earlier than `after`
    /// (`None`: not set yet); never if the worker is gone.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn deadline_changed(&self, after: Option<Instant>) -> Instant {
        let mut rx = self.deadline.clone();
        let sooner = |d: &Option<Instant>| match (*d, after) {
            (Some(d), Some(a)) => d < a,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let changed = match rx.wait_for(sooner).await {
            Ok(d) => *d,
            Err(_) => None,
        };
        match changed {
            Some(d) => d,
            None => std::future::pending().await,
        }
    }
}
