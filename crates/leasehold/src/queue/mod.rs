//! The per-key serialised task queue: one running task per key, global capacity slots, fair
//! choice across keys.
//!
//! A task is enqueued for a **key** (the unit that must be serialised, e.g. a user) with an
//! optional **group** (an accounting unit, e.g. a project), a [`Priority`] and an opaque payload.
//! Workers [`claim`](QueueBackend::claim) tasks; the backend hands out a task only when
//!
//! - fewer than `max_running` tasks run in the whole queue (the global capacity slots),
//! - no other task of the same key runs (per-key serialisation),
//! - fewer than `group_limit` tasks of its group run (when a limit is given).
//!
//! # Fairness
//! Among the keys that may run, the one whose head task has the best effective priority wins;
//! between equal priorities the key served least recently wins (round robin over keys), so a key
//! with one pending task waits at most one round behind a key with a thousand. Inside a key, tasks
//! run in priority then arrival order. **Aging**: [`recover`](QueueBackend::recover) raises a
//! pending task's effective priority by one level for every `aging` period it has waited, so a
//! low-priority task never starves.
//!
//! # Crashes
//! A claimed task carries its worker's heartbeat expiry; a worker renews it with
//! [`heartbeat`](QueueBackend::heartbeat). When it lapses (the worker died), `recover` applies the
//! task's [`Policy`]: [`Policy::AtMostOnce`] marks it failed (it may have run, it is never run
//! again), [`Policy::AtLeastOnce`] puts it back as pending until its attempts are used up. A task
//! is never lost: every claimed task ends in a final state through its worker or through
//! `recover`. Tasks running past their timeout get a cancel request their worker acts on.
//!
//! # Backends
//! | URL | module | feature |
//! |---|---|---|
//! | `sqlite:///path/queue.db` | [`sqlite`] | `queue` |
//! | `postgres://user@host:port/db` | `postgres` | `queue-postgres` |
//!
//! The decisions are made inside one transaction per call, so several worker processes (SQLite:
//! on one host; PostgreSQL: on many) share a queue safely. The key's lease itself comes from a
//! [`LockStore`](crate::LockStore): the worker takes it before it runs the task.
//!
//! # Workers
//! [`worker::Worker`] is the whole worker protocol — claim, take the key's lease, run, heartbeat,
//! recover, record the end — around any [`TaskRunner`](worker::TaskRunner): an async closure in
//! a Rust service, or the process runner of `leasehold queue work`.

pub mod metrics;
pub(crate) mod row;
pub mod sqlite;
pub mod worker;

#[cfg(feature = "queue-postgres")]
pub mod postgres;

use crate::error::{Error, Result};
pub(crate) use row::{
    ids_i64, ms_i64, now_i64, outcome_parts, RawTask, CANCEL_NONE, CANCEL_REQUESTED,
    CANCEL_TIMEOUT, COLUMNS,
};
use serde::Serialize;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// A task's priority. Effective priority also grows with waiting time (aging). Priorities order
/// as they run: `High < Normal < Low`.
///
/// ```
/// use leasehold::queue::Priority;
/// assert!(Priority::High < Priority::Normal && Priority::Normal < Priority::Low);
/// assert_eq!(" HIGH ".parse::<Priority>()?, Priority::High); // any case, trimmed
/// assert!("urgent".parse::<Priority>().is_err());
/// assert_eq!(Priority::from_rank(Priority::Low.rank()), Some(Priority::Low));
/// assert_eq!(Priority::from_rank(3), None);
/// assert_eq!(Priority::Normal.to_string(), "normal");
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Runs before normal and low tasks.
    High,
    /// The default.
    Normal,
    /// Runs after high and normal tasks (until aged).
    Low,
}

impl Priority {
    /// Rank: 0 for high, 1 normal, 2 low (lower runs first).
    pub fn rank(self) -> i64 {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    /// The priority of a rank (0–2).
    pub fn from_rank(rank: i64) -> Option<Self> {
        match rank {
            0 => Some(Priority::High),
            1 => Some(Priority::Normal),
            2 => Some(Priority::Low),
            _ => None,
        }
    }

    /// `high`, `normal` or `low`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = Error;
    /// `high`, `normal` or `low` (any case).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the accepted values.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "high" => Ok(Priority::High),
            "normal" => Ok(Priority::Normal),
            "low" => Ok(Priority::Low),
            _ => Err(Error::option(
                "priority",
                format!("{s:?} is not a priority (use high, normal or low)"),
            )),
        }
    }
}

/// What happens to a task whose worker died while it ran (applied by
/// [`recover`](QueueBackend::recover)). A task's `max_attempts` must be at least 1: enqueueing
/// with 0 fails with [`Error::InvalidOption`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = tempfile::tempdir().unwrap();
/// # let q = leasehold::queue::open_queue(&format!("sqlite://{}/q.db", dir.path().display())).await?;
/// use leasehold::{queue::{NewTask, Policy}, Error};
/// let mut task = NewTask::new("alice", "job");
/// task.policy = Policy::AtLeastOnce { max_attempts: 3 };
/// assert!(q.enqueue(&task).await.is_ok());
/// task.policy = Policy::AtLeastOnce { max_attempts: 0 };
/// let refused = q.enqueue(&task).await;
/// assert!(matches!(refused, Err(Error::InvalidOption { name: "max_attempts", .. })));
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "policy")]
pub enum Policy {
    /// Marked failed: it may have run partly, it is never started again.
    AtMostOnce,
    /// Put back as pending while fewer than `max_attempts` attempts were made, then failed.
    AtLeastOnce {
        /// Attempts in all, the first included (≥ 1).
        max_attempts: u32,
    },
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::AtMostOnce => "at-most-once",
            Policy::AtLeastOnce { .. } => "at-least-once",
        }
    }

    fn max_attempts(self) -> u32 {
        match self {
            Policy::AtMostOnce => 1,
            Policy::AtLeastOnce { max_attempts } => max_attempts.max(1),
        }
    }

    fn from_parts(name: &str, max_attempts: i64) -> Option<Self> {
        match name {
            "at-most-once" => Some(Policy::AtMostOnce),
            "at-least-once" => Some(Policy::AtLeastOnce {
                max_attempts: u32::try_from(max_attempts).ok()?,
            }),
            _ => None,
        }
    }
}

/// A task to enqueue.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// The key whose tasks run one at a time (validated like a lock key).
    pub key: String,
    /// The accounting group, if any.
    pub group: Option<String>,
    /// The priority.
    pub priority: Priority,
    /// Opaque payload (the CLI stores the command line as JSON).
    pub payload: String,
    /// The longest the task may run; the worker cancels it after that.
    pub timeout: Option<Duration>,
    /// What happens when its worker dies.
    pub policy: Policy,
}

impl NewTask {
    /// A normal-priority, at-most-once task without group or timeout. Set the public fields to
    /// change that; they are checked when the task is enqueued: [`enqueue`](QueueBackend::enqueue)
    /// refuses a key [`Key::new`](crate::Key::new) refuses ([`Error::InvalidKey`]), and with
    /// [`Error::InvalidOption`] a group that is empty, over 256 bytes or has control characters,
    /// a zero timeout, and zero `max_attempts`.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let q = leasehold::queue::open_queue(&format!("sqlite://{}/q.db", dir.path().display())).await?;
    /// use leasehold::{queue::NewTask, Error};
    /// use std::time::Duration;
    /// let mut task = NewTask::new("alice", r#"{"cmd": "backup"}"#);
    /// task.group = Some("project-7".into());
    /// task.timeout = Some(Duration::from_secs(600));
    /// assert!(q.enqueue(&task).await.is_ok());
    /// let no_key = q.enqueue(&NewTask::new("", "x")).await;
    /// assert!(matches!(no_key, Err(Error::InvalidKey { .. })));
    /// task.timeout = Some(Duration::ZERO);
    /// assert!(matches!(q.enqueue(&task).await, Err(Error::InvalidOption { name: "timeout", .. })));
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn new(key: impl Into<String>, payload: impl Into<String>) -> Self {
        NewTask {
            key: key.into(),
            group: None,
            priority: Priority::Normal,
            payload: payload.into(),
            timeout: None,
            policy: Policy::AtMostOnce,
        }
    }

    fn validate(&self) -> Result<()> {
        crate::key::Key::new(&self.key)?;
        if let Some(g) = &self.group {
            if g.is_empty() || g.len() > 256 || g.chars().any(char::is_control) {
                return Err(Error::option(
                    "group",
                    "must be 1–256 bytes without control characters",
                ));
            }
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(Error::option("timeout", "must be more than zero"));
        }
        if let Policy::AtLeastOnce { max_attempts: 0 } = self.policy {
            return Err(Error::option("max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}

/// Where an enqueued task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    /// The task id (unique in the queue, increasing).
    pub id: u64,
    /// Its place in its key's line: 1 = next to run for that key.
    pub position: u64,
}

/// A task's life-cycle state.
///
/// ```
/// use leasehold::queue::TaskState;
/// assert!(!TaskState::Running.is_final());
/// assert!(TaskState::Cancelled.is_final());
/// assert_eq!(TaskState::Succeeded.to_string(), "succeeded");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting to run.
    Pending,
    /// Claimed by a worker (taking the lease or running).
    Running,
    /// Ended with success.
    Succeeded,
    /// Ended with failure (exit status, cannot start, timeout, worker lost …; see `detail`).
    Failed,
    /// Cancelled before or while running.
    Cancelled,
}

impl TaskState {
    /// The state's name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => TaskState::Pending,
            "running" => TaskState::Running,
            "succeeded" => TaskState::Succeeded,
            "failed" => TaskState::Failed,
            "cancelled" => TaskState::Cancelled,
            _ => return None,
        })
    }

    /// Whether the task has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a running task should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CancelReason {
    /// An operator cancelled it.
    Cancelled,
    /// It ran past its timeout.
    Timeout,
}

/// One task as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Task {
    /// Its id.
    pub id: u64,
    /// Its key.
    pub key: String,
    /// Its group.
    pub group: Option<String>,
    /// The priority it was enqueued with.
    pub priority: Priority,
    /// Its effective priority now (after aging).
    pub effective: Priority,
    /// The payload.
    pub payload: String,
    /// Its state.
    pub state: TaskState,
    /// Its crash policy.
    #[serde(flatten)]
    pub policy: Policy,
    /// Attempts started so far.
    pub attempts: u32,
    /// Its timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// When it was enqueued (Unix ms).
    pub enqueued_ms: u64,
    /// When its last attempt was claimed (Unix ms).
    pub started_ms: Option<u64>,
    /// When it ended (Unix ms).
    pub ended_ms: Option<u64>,
    /// The worker running it (or that ran it last).
    pub worker: Option<String>,
    /// The fence of the key lease its worker holds for it.
    pub fence: Option<u64>,
    /// When its worker's claim lapses unless renewed (Unix ms).
    pub lease_expires_ms: Option<u64>,
    /// A pending cancel request for a running task.
    pub cancel: Option<CancelReason>,
    /// Why it ended the way it did, or was requeued.
    pub detail: Option<String>,
}

/// A row of [`list`](QueueBackend::list): a task, or a record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum TaskEntry {
    /// A readable task.
    Task(Task),
    /// A corrupt record: reported, skipped by dispatch, not fatal to the rest.
    Corrupt {
        /// Its id.
        id: u64,
        /// What is wrong with it.
        corrupt: String,
    },
}

/// What a worker asks of [`claim`](QueueBackend::claim).
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The worker's id (holder id).
    pub worker: String,
    /// The global capacity: no claim while this many tasks run in the whole queue.
    pub max_running: u32,
    /// At most this many running tasks per group.
    pub group_limit: Option<u32>,
    /// How long the claim lives without a heartbeat.
    pub ttl: Duration,
}

/// How a task ended, for [`finish`](QueueBackend::finish).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded.
    Succeeded,
    /// It failed; why.
    Failed(String),
    /// It was cancelled (by request or timeout); why.
    Cancelled(String),
}

/// What [`cancel`](QueueBackend::cancel) did.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = tempfile::tempdir().unwrap();
/// # let q = leasehold::queue::open_queue(&format!("sqlite://{}/q.db", dir.path().display())).await?;
/// use leasehold::{queue::{Cancelled, NewTask, TaskState}, Error};
/// let t = q.enqueue(&NewTask::new("alice", "job")).await?;
/// assert_eq!(q.cancel(t.id).await?, Cancelled::Cancelled); // pending: never runs
/// assert_eq!(q.cancel(t.id).await?, Cancelled::AlreadyEnded(TaskState::Cancelled));
/// assert!(matches!(q.cancel(t.id + 1).await, Err(Error::NotFound { .. })));
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cancelled {
    /// The task was pending and is now cancelled.
    Cancelled,
    /// The task runs; its worker was asked to stop it.
    Requested,
    /// The task had already ended in this state.
    AlreadyEnded(TaskState),
}

/// What one [`recover`](QueueBackend::recover) pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Recovered {
    /// Tasks of dead workers put back as pending (at-least-once).
    pub requeued: Vec<u64>,
    /// Tasks of dead workers marked failed (at-most-once, or attempts used up).
    pub failed: Vec<u64>,
    /// Running tasks past their timeout whose worker was asked to stop them.
    pub timed_out: Vec<u64>,
    /// Pending tasks whose effective priority was raised.
    pub aged: u64,
}

/// One key's numbers in [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyCount {
    /// The key (or group).
    pub name: String,
    /// Pending tasks.
    pub pending: u64,
    /// Running tasks.
    pub running: u64,
}

/// The lease of a key whose task runs, as its worker recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyLease {
    /// The key.
    pub key: String,
    /// The task.
    pub task: u64,
    /// The worker (lease holder).
    pub holder: String,
    /// The lease's fence, once taken.
    pub fence: Option<u64>,
    /// When the task was claimed (Unix ms).
    pub acquired_ms: u64,
    /// When the worker's claim expires unless renewed (Unix ms).
    pub expires_ms: u64,
}

/// A live worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerInfo {
    /// Its id.
    pub id: String,
    /// Its slots.
    pub slots: u32,
    /// When its heartbeat lapses (Unix ms).
    pub expires_ms: u64,
}

/// The queue at a glance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Status {
    /// Pending tasks by effective priority: high, normal, low.
    pub pending: PendingCounts,
    /// Running tasks (slots used).
    pub running: u64,
    /// The largest slot count among live workers (the global capacity they enforce); 0 without
    /// workers.
    pub slots: u64,
    /// Tasks ended, by state.
    pub succeeded: u64,
    /// Failed tasks.
    pub failed: u64,
    /// Cancelled tasks.
    pub cancelled: u64,
    /// Records that cannot be read.
    pub corrupt: u64,
    /// Pending and running by group (tasks without group are left out).
    pub groups: Vec<KeyCount>,
    /// Pending and running by key, busiest first, at most [`Status::KEYS_SHOWN`].
    pub keys: Vec<KeyCount>,
    /// How many keys have pending or running tasks.
    pub keys_total: u64,
    /// Leases of the keys whose tasks run.
    pub leases: Vec<KeyLease>,
    /// Live workers.
    pub workers: Vec<WorkerInfo>,
}

impl Status {
    /// How many keys `keys` lists.
    pub const KEYS_SHOWN: usize = 100;

    /// Counts `n` tasks of a backend's row state `state` with priority rank `rank` (0 high, 1
    /// normal, 2 low; read for pending tasks only); any other state counts as corrupt.
    pub(crate) fn count(&mut self, state: &str, rank: i64, n: u64) {
        let s = self;
        match (state, rank) {
            ("pending", 0) => s.pending.high += n,
            ("pending", 1) => s.pending.normal += n,
            ("pending", 2) => s.pending.low += n,
            ("running", _) => s.running += n,
            ("succeeded", _) => s.succeeded += n,
            ("failed", _) => s.failed += n,
            ("cancelled", _) => s.cancelled += n,
            _ => s.corrupt += n,
        }
    }
}

/// Pending tasks by effective priority.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PendingCounts {
    /// High.
    pub high: u64,
    /// Normal.
    pub normal: u64,
    /// Low.
    pub low: u64,
}

/// Where queue state lives: the operations every backend offers, each one transaction.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::queue::{open_queue, ClaimRequest, NewTask, Outcome};
/// use std::time::Duration;
/// let dir = tempfile::tempdir().unwrap();
/// let q = open_queue(&format!("sqlite://{}/q.db", dir.path().display())).await?;
/// let first = q.enqueue(&NewTask::new("alice", "job 1")).await?;
/// let second = q.enqueue(&NewTask::new("alice", "job 2")).await?;
/// q.enqueue(&NewTask::new("bob", "job 3")).await?;
/// assert_eq!((first.position, second.position), (1, 2)); // places in alice's line
/// let ttl = Duration::from_secs(30);
/// let req = ClaimRequest { worker: "w1".into(), max_running: 10, group_limit: None, ttl };
/// assert_eq!(q.claim(&req).await?.expect("a task").id, first.id);
/// assert_eq!(q.claim(&req).await?.expect("a task").key, "bob");
/// assert!(q.claim(&req).await?.is_none(), "alice's second waits for her first");
/// assert!(q.finish(first.id, "w1", &Outcome::Succeeded).await?);
/// assert_eq!(q.claim(&req).await?.expect("a task").id, second.id);
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
///
/// Implemented by [`sqlite::SqliteQueue`] and (feature `queue-postgres`) `postgres::PgQueue`.
/// The shared test suite (`leasehold-testkit`'s `queue_suite`) runs against each.
///
/// # Cancel safety
/// Each call is one transaction: dropping its future either leaves the queue unchanged or
/// applied in full (the SQLite backend finishes the call on a blocking thread either way).
#[async_trait::async_trait]
pub trait QueueBackend: Send + Sync + fmt::Debug + 'static {
    /// Adds a task as pending.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] / [`Error::InvalidOption`] for bad input; a store error.
    async fn enqueue(&self, task: &NewTask) -> Result<Enqueued>;

    /// Adds many tasks, in order; backends do it in one transaction (all or none). The default
    /// enqueues them one by one.
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue); every task is validated before any is added.
    async fn enqueue_batch(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>> {
        for t in tasks {
            t.validate()?;
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(self.enqueue(t).await?);
        }
        Ok(out)
    }

    /// Picks the next task that may run (see the module docs for the rules), marks it running
    /// for `req.worker` and counts an attempt. `Ok(None)`: nothing may run now. Corrupt pending
    /// records met on the way are marked failed and skipped.
    ///
    /// # Errors
    /// A store error.
    async fn claim(&self, req: &ClaimRequest) -> Result<Option<Task>>;

    /// Gives a claimed task back as pending without counting the attempt (its key lease was not
    /// obtained). `false` when the task is no longer this worker's.
    ///
    /// # Errors
    /// A store error.
    async fn unclaim(&self, id: u64, worker: &str) -> Result<bool>;

    /// Records the fence of the key lease taken for a claimed task. `false` when the task is no
    /// longer this worker's (it must not be started).
    ///
    /// # Errors
    /// A store error.
    async fn started(&self, id: u64, worker: &str, fence: u64) -> Result<bool>;

    /// Renews the worker's registration, and the claims of the tasks it names as running
    /// (`running`) until `now + ttl`; answers the running tasks of this worker that should stop,
    /// and why. Claims recorded as the worker's that it does not name — a task its previous life
    /// under the same name had started, one whose end it failed to record — are not renewed: they
    /// lapse, and [`recover`](QueueBackend::recover) applies their policy, as for a dead worker.
    ///
    /// # Errors
    /// A store error.
    async fn heartbeat(
        &self,
        worker: &str,
        slots: u32,
        ttl: Duration,
        running: &[u64],
    ) -> Result<Vec<(u64, CancelReason)>>;

    /// The running tasks claimed by `worker`, each with whether it was started (its fence
    /// recorded by [`started`](QueueBackend::started)), in id order. A worker compares them with
    /// the tasks it runs: a claim whose answer was lost (the connection ended, or the call's
    /// bound ran out, after the commit) is the worker's here but unknown to it, and its
    /// heartbeats would keep it — holding its key and a slot — for as long as the worker lives.
    ///
    /// # Errors
    /// A store error.
    async fn claims(&self, worker: &str) -> Result<Vec<(u64, bool)>>;

    /// Ends a running task. `false` when it is no longer this worker's (recovered meanwhile):
    /// nothing is changed then.
    ///
    /// # Errors
    /// A store error.
    async fn finish(&self, id: u64, worker: &str, outcome: &Outcome) -> Result<bool>;

    /// Cancels a pending task, or asks the worker of a running one to stop it.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown id; a store error.
    async fn cancel(&self, id: u64) -> Result<Cancelled>;

    /// One task.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown id; a store error.
    async fn get(&self, id: u64) -> Result<TaskEntry>;

    /// Tasks in id order: pending and running ones, and ended ones too when `all`; at most
    /// `limit`.
    ///
    /// # Errors
    /// A store error.
    async fn list(&self, all: bool, limit: u64) -> Result<Vec<TaskEntry>>;

    /// Counts and leases for status reports.
    ///
    /// # Errors
    /// A store error.
    async fn status(&self) -> Result<Status>;

    /// Reclaims tasks of dead workers by their policy, asks workers to stop tasks past their
    /// timeout, ages pending tasks waiting longer than `aging` per level, forgets dead workers.
    ///
    /// # Errors
    /// A store error.
    async fn recover(&self, aging: Duration) -> Result<Recovered>;

    /// Deletes the tasks that ended (succeeded, failed or cancelled) at least `older_than` ago
    /// by the queue's clock (the server's, on PostgreSQL), and the bookkeeping of keys left with
    /// no task at all (such a key's turn in the round robin starts afresh when it comes back).
    /// Pending and running tasks are never deleted, nor rows whose state does not parse (`ls
    /// --all` shows them as corrupt). Tasks go in batches of [`CLEANUP_BATCH`], one transaction
    /// each, so workers and enqueuers go on meanwhile. Returns how many tasks were deleted; an
    /// error part way leaves the batches before it deleted.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::queue::{open_queue, ClaimRequest, NewTask, Outcome};
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let q = open_queue(&format!("sqlite://{}/queue.db", dir.path().display())).await?;
    /// let id = q.enqueue(&NewTask::new("alice", "{}")).await?.id;
    /// let req = ClaimRequest { worker: "w".into(), max_running: 1, group_limit: None, ttl: Duration::from_secs(10) };
    /// let task = q.claim(&req).await?.expect("pending");
    /// q.finish(task.id, "w", &Outcome::Succeeded).await?;
    /// assert_eq!(q.cleanup(Duration::from_secs(3600)).await?, 0, "ended just now");
    /// assert_eq!(q.cleanup(Duration::ZERO).await?, 1);
    /// assert!(q.get(id).await.is_err(), "gone");
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// A store error.
    async fn cleanup(&self, older_than: Duration) -> Result<u64>;

    /// Removes a worker's registration (when it stops).
    ///
    /// # Errors
    /// A store error.
    async fn deregister(&self, worker: &str) -> Result<()>;

    /// Waits until the queue may have changed (a notification where the backend has one) or
    /// `max` passes. Cancel safe.
    async fn changed(&self, max: Duration);
}

/// How many ended tasks one transaction of [`QueueBackend::cleanup`] deletes.
pub const CLEANUP_BATCH: u64 = 10_000;

/// Opens the queue a URL names: `sqlite:///path/queue.db` or `postgres://…`.
///
/// # Errors
/// [`Error::InvalidUrl`] for a URL that is not understood, [`Error::FeatureNotEnabled`] for
/// PostgreSQL without `queue-postgres`, and the backend's errors (a database that cannot be
/// opened or reached).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = tempfile::tempdir().unwrap();
/// let url = format!("sqlite://{}/queue.db", dir.path().display());
/// let q = leasehold::queue::open_queue(&url).await?;
/// let t = q.enqueue(&leasehold::queue::NewTask::new("alice", "job 1")).await?;
/// assert_eq!(t.position, 1);
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
pub async fn open_queue(url: &str) -> Result<Arc<dyn QueueBackend>> {
    let bad = |reason: &str| Error::InvalidUrl {
        url: crate::url::redact(url),
        reason: reason.into(),
    };
    let (scheme, _) = url
        .split_once("://")
        .ok_or_else(|| bad("expected sqlite:///path/queue.db or postgres://…"))?;
    match scheme.to_ascii_lowercase().as_str() {
        "sqlite" => Ok(Arc::new(sqlite::SqliteQueue::from_url(url).await?)),
        #[cfg(feature = "queue-postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(postgres::PgQueue::connect(url).await?)),
        #[cfg(not(feature = "queue-postgres"))]
        "postgres" | "postgresql" => Err(Error::FeatureNotEnabled {
            scheme: scheme.into(),
            feature: "queue-postgres",
        }),
        _ => Err(bad("unknown queue scheme (known: sqlite, postgres)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_parse_and_rank() {
        assert_eq!("HIGH".parse::<Priority>().unwrap(), Priority::High);
        assert_eq!(" low ".parse::<Priority>().unwrap(), Priority::Low);
        assert!(matches!(
            "urgent".parse::<Priority>(),
            Err(Error::InvalidOption {
                name: "priority",
                ..
            })
        ));
        for p in [Priority::High, Priority::Normal, Priority::Low] {
            assert_eq!(Priority::from_rank(p.rank()), Some(p));
        }
    }
}
