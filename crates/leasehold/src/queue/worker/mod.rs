//! The queue's worker: claims tasks and runs each under its key's lease, with any [`TaskRunner`]
//! — an async closure in a Rust service, a process supervisor in `leasehold queue work`.
//!
//! A [`Worker`] is the whole worker protocol of a queue; the runner only does the task's work:
//!
//! - **Claims** tasks while it has free slots ([`QueueBackend::claim`]: global capacity, one
//!   running task per key, group limits, fair choice across keys), woken by the queue's change
//!   notification ([`QueueBackend::changed`]) or at the latest every 200 ms while a slot is free.
//! - **Takes the key's lease** for each claimed task from the lock store ([`Locks`]), waiting up
//!   to the lease wait; if it cannot, the task goes back to the queue
//!   ([`QueueBackend::unclaim`], the attempt not counted). With the lease it records the fence
//!   ([`QueueBackend::started`]) and only then runs the task.
//! - **Heartbeats** every TTL/3: renews its registration and the claims of the tasks it runs, and
//!   learns of cancel requests and timeouts, which it passes on to the tasks' runners.
//! - **Gives back unknown claims** at each heartbeat: a claim the queue names this worker's but
//!   the worker never heard of (the claim's answer was lost after its commit) goes back to the
//!   queue, instead of holding its key and a slot for as long as the worker lives.
//! - **Recovers** the queue every TTL/2 (at most every second): the tasks of workers that died
//!   are requeued or failed by their [`Policy`](super::Policy), tasks past their timeout are
//!   asked to stop, pending tasks age ([`QueueBackend::recover`]).
//! - **Cleans up**, when asked to ([`Worker::cleanup_after`]): deletes the tasks that ended long
//!   enough ago, at start and then hourly, on a task of its own.
//! - **Records each end** ([`QueueBackend::finish`]) and only then releases the key's lease, so
//!   the key's next task never starts before this one's end is recorded.
//! - **Drains** on [`Shutdown::drain`]: claims nothing more, lets the running tasks finish for up
//!   to the drain timeout, then tells them to stop; [`Shutdown::stop`] tells them at once.
//!
//! # Stopping a task
//! A runner is told to stop through its [`RunningTask`]: [`RunningTask::stopped`] completes with
//! a [`TaskStop`] when an operator cancelled the task, it ran past its timeout, the worker shuts
//! down, or **the key's lease must be given up**. The runner must then stop the task's work and
//! return; [`TaskStop::outcome`] is the outcome to record. The lease is the urgent case: the
//! worker says so at the lease's stop-by deadline
//! ([`LeaseGuard::must_stop`](crate::LeaseGuard::must_stop): renewals have failed until
//! `valid_until` less the loss grace), or at once when the store says the lease is gone, with
//! [`TaskStop::LeaseLost`]. Another worker may be granted the key once the lease has expired,
//! so the task must be gone by [`RunningTask::deadline`] (the lease's `valid_until`; now when the
//! store says it is gone) — stop at once, and pass [`RunningTask::fence`] to whatever the task
//! writes so that a late write is refused. A runner still running at the lease's `valid_until`
//! is dropped (its future cancelled at its next `.await`), and the stop's outcome recorded; told
//! to stop for any other reason, one that has not returned [`Worker::stop_grace`] later is.
//!
//! # Identity
//! The worker's name in the queue is the holder id of its [`Locks`] ([`Locks::holder`]), which
//! also holds the key leases: `POD_NAMESPACE/POD_NAME` under Kubernetes, else host, pid and a
//! random part ([`HolderId::from_env`](crate::HolderId::from_env)); set another with
//! [`Locks::with_holder`]. Two live workers must not share a name: each would give back the
//! other's claims as unknown to it. So a worker holds a lease on its name, the key
//! [`WORKER_KEY_PREFIX`]`NAME` of the same lock store, for as long as it runs. A second worker
//! started under a live worker's name waits for that lease (a restarted pod's previous life
//! holds it until its TTL runs out) for up to twice the TTL plus a second, then refuses to start
//! ([`Error::InvalidOption`] `worker name`, naming the other's holder). A worker whose name lease
//! is lost (a pause past its TTL, the store out of reach) gives back no claim as unknown until it
//! has taken the lease back (tried at each heartbeat); if it is still held by then as long as a
//! start waits, another worker holds it: it claims nothing more and drains.
//!
//! # Example
//! A queue on SQLite run in-process with an async closure: a few tasks enqueued, a worker run
//! until they are done, then drained.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use leasehold::queue::worker::{RunningTask, Worker};
//! use leasehold::queue::{open_queue, NewTask, Outcome};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let queue = open_queue(&format!("sqlite://{}/queue.db", dir.path().display())).await?;
//! let locks = leasehold::connect(&format!("file://{}/locks", dir.path().display())).await?;
//! for user in ["alice", "bob", "alice"] {
//!     queue.enqueue(&NewTask::new(user, format!("report for {user}"))).await?;
//! }
//!
//! let worker = Worker::new(queue.clone(), locks).slots(2).ttl(Duration::from_secs(3));
//! let shutdown = worker.shutdown_handle();
//! let running = tokio::spawn(worker.run(|task: RunningTask| async move {
//!     // The task's work, with its fence for the writes it makes; stopped when told to.
//!     let work = async {
//!         println!("{} (fence {})", task.task().payload, task.fence());
//!         tokio::time::sleep(Duration::from_millis(20)).await;
//!     };
//!     tokio::select! {
//!         () = work => Outcome::Succeeded,
//!         why = task.stopped() => why.outcome(),
//!     }
//! }));
//!
//! while queue.status().await?.succeeded < 3 {
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//! }
//! shutdown.drain(); // no new claims; running tasks finish (here: none is left)
//! running.await.unwrap()?;
//! assert_eq!(queue.status().await?.workers.len(), 0, "deregistered");
//! # Ok::<(), leasehold::Error>(()) }).unwrap();
//! ```

mod options;
mod runner;
mod task;

pub use options::WorkerOptions;
pub use runner::{RunningTask, TaskRunner, TaskStop};

use super::metrics::QueueMetrics;
use super::{CancelReason, ClaimRequest, QueueBackend};
use crate::client::Locks;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

/// The prefix of the key a worker holds a lease on for as long as it runs, followed by its name
/// (see [Identity](self#identity)): keep task keys out of it.
pub const WORKER_KEY_PREFIX: &str = "leasehold.queue.worker/";

/// How long a worker with a free slot waits for the queue's change notification before it tries
/// to claim again.
const IDLE_POLL: Duration = Duration::from_millis(200);

/// Where a worker is in its shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Working,
    Draining,
    Stopping,
}

/// Shuts a [`Worker`] down from outside its [`run`](Worker::run) (a signal handler, a service's
/// shutdown); cheap to clone. Calls are idempotent, and may come before `run` starts.
#[derive(Debug, Clone)]
pub struct Shutdown {
    phase: Arc<watch::Sender<Phase>>,
}

impl Shutdown {
    fn new() -> Self {
        Shutdown {
            phase: Arc::new(watch::channel(Phase::Working).0),
        }
    }

    /// Drains: no task is claimed any more, the running ones may finish for up to the drain
    /// timeout ([`Worker::drain_timeout`]) and are then told to stop ([`TaskStop::Shutdown`]).
    /// `run` returns once none runs.
    pub fn drain(&self) {
        self.phase.send_if_modified(|p| {
            let start = *p == Phase::Working;
            if start {
                *p = Phase::Draining;
            }
            start
        });
    }

    /// Drains, and tells the running tasks to stop now ([`TaskStop::Shutdown`]).
    pub fn stop(&self) {
        self.phase.send_if_modified(|p| {
            let start = *p != Phase::Stopping;
            *p = Phase::Stopping;
            start
        });
    }

    /// Whether [`drain`](Self::drain) or [`stop`](Self::stop) was called.
    pub fn is_requested(&self) -> bool {
        *self.phase.borrow() != Phase::Working
    }
}

/// A callback told of each problem the worker meets and goes on from.
type Report = Arc<dyn Fn(&str) + Send + Sync>;

/// A queue worker: claims tasks of a [`QueueBackend`] and runs each with a [`TaskRunner`] under
/// its key's lease from [`Locks`]. See the [module docs](self) for the protocol and an example.
///
/// Built with [`Worker::new`] and the option methods (each documents its default), started with
/// [`run`](Worker::run), shut down through its [`Shutdown`] handle.
pub struct Worker {
    queue: Arc<dyn QueueBackend>,
    locks: Locks,
    opts: WorkerOptions,
    metrics: Option<QueueMetrics>,
    report: Option<Report>,
    shutdown: Shutdown,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the queue: a backend's own `Debug` is not bound to keep its URL's secrets.
        f.debug_struct("Worker")
            .field("name", &self.name())
            .field("options", &self.opts)
            .field("metrics", &self.metrics.is_some())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker on `queue` taking the key leases from `locks` (whose holder id is the worker's
    /// name), with the default [`WorkerOptions`], no metrics, and problems logged at WARN.
    pub fn new(queue: Arc<dyn QueueBackend>, locks: Locks) -> Self {
        Worker {
            queue,
            locks,
            opts: WorkerOptions::default(),
            metrics: None,
            report: None,
            shutdown: Shutdown::new(),
        }
    }

    /// Sets every option at once (see [`WorkerOptions`] for the defaults).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::queue::worker::{Worker, WorkerOptions};
    /// let queue = leasehold::queue::open_queue(&format!("sqlite://{}/q.db", dir.path().display())).await?;
    /// let mut opts = WorkerOptions::default();
    /// opts.slots = 2;
    /// let worker = Worker::new(queue, leasehold::connect("memory://").await?).options(opts.clone());
    /// assert_eq!(worker.current_options(), &opts);
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn options(mut self, opts: WorkerOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The options in effect.
    pub fn current_options(&self) -> &WorkerOptions {
        &self.opts
    }

    /// Sets [`WorkerOptions::slots`].
    pub fn slots(mut self, slots: u32) -> Self {
        self.opts.slots = slots;
        self
    }

    /// Sets [`WorkerOptions::group_limit`].
    pub fn group_limit(mut self, limit: u32) -> Self {
        self.opts.group_limit = Some(limit);
        self
    }

    /// Sets [`WorkerOptions::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.opts.ttl = ttl;
        self
    }

    /// Sets [`WorkerOptions::lease_wait`].
    pub fn lease_wait(mut self, wait: Duration) -> Self {
        self.opts.lease_wait = Some(wait);
        self
    }

    /// Sets [`WorkerOptions::aging`].
    pub fn aging(mut self, aging: Duration) -> Self {
        self.opts.aging = aging;
        self
    }

    /// Sets [`WorkerOptions::drain_timeout`].
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.opts.drain_timeout = timeout;
        self
    }

    /// Sets [`WorkerOptions::stop_grace`].
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.opts.stop_grace = grace;
        self
    }

    /// Sets [`WorkerOptions::cleanup_after`].
    pub fn cleanup_after(mut self, older: Duration) -> Self {
        self.opts.cleanup_after = Some(older);
        self
    }

    /// Sets [`WorkerOptions::exit_when_idle`].
    pub fn exit_when_idle(mut self, on: bool) -> Self {
        self.opts.exit_when_idle = on;
        self
    }

    /// Counts this worker's started, finished and recovered tasks in `metrics` (default: none).
    /// The queue-wide gauges are set by whoever calls [`QueueMetrics::observe`].
    pub fn metrics(mut self, metrics: QueueMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Tells `report` of each problem the worker meets and goes on from, one line each (a failed
    /// claim, heartbeat, recovery or cleanup; a task end that cannot be recorded; a lease that
    /// cannot be taken or released …), instead of logging it at WARN.
    pub fn on_problem(mut self, report: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.report = Some(Arc::new(report));
        self
    }

    /// The handle that shuts this worker down; take it before [`run`](Self::run).
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// The worker's name in the queue: its [`Locks`]' holder id.
    pub fn name(&self) -> &str {
        self.locks.holder().as_str()
    }

    /// Registers the worker and runs the protocol (see the [module docs](self)) with `runner`
    /// until it is shut down and no task runs any more — or, with
    /// [`exit_when_idle`](Self::exit_when_idle), until the queue is idle — then deregisters.
    /// Each task's lease is released when its end is recorded; other leases of the same
    /// [`Locks`] are left alone.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a TTL under 30 ms, or zero slots or group limit;
    /// [`Error::InvalidOption`] `worker name` when another live worker runs under this name
    /// (see [Identity](self#identity)); the lock store's error when the name lease cannot be
    /// taken; the queue's error when the worker cannot register (its first heartbeat). Later problems are reported
    /// ([`on_problem`](Self::on_problem)) and the worker goes on: the failed step is tried again
    /// at its next round.
    ///
    /// # Cancel safety
    /// Not cancel safe. Dropping the future drops every running task's runner at its next
    /// `.await` without recording the task's end: the claims lapse a TTL later and the queue's
    /// recovery applies each task's policy, as for a worker that died; the key leases are
    /// released in the background. Shut down with [`Shutdown`] instead.
    pub async fn run(self, runner: impl TaskRunner) -> Result<()> {
        self.opts.validate()?;
        let worker: Arc<str> = Arc::from(self.name());
        let mut phase = self.shutdown.phase.subscribe();
        let name_lease = Some(self.take_name(&worker).await?);
        self.queue
            .heartbeat(&worker, self.opts.slots, self.opts.ttl, &[])
            .await?;
        tracing::info!(worker = %worker, slots = self.opts.slots, "worker started");
        let mut run = Rounds::new(&self, worker, Arc::new(runner), name_lease);
        let cleaner = self
            .opts
            .cleanup_after
            .map(|older| AbortOnDrop(tokio::spawn(clean_up(run.ctx.clone(), older))));
        let mut beat = tokio::time::interval(self.opts.ttl / 3);
        let mut recover = tokio::time::interval((self.opts.ttl / 2).min(Duration::from_secs(1)));
        run.drain(*phase.borrow_and_update());
        loop {
            run.fill_slots().await;
            if run.runners.is_empty() && run.done().await {
                break;
            }
            let drain_at = run.drain.deadline();
            let lease = run.name_lease.as_ref();
            tokio::select! {
                biased;
                Ok(()) = phase.changed() => {
                    let now = *phase.borrow_and_update();
                    run.drain(now);
                }
                Some(_) = run.runners.join_next() => {}
                _ = async { match lease { Some(g) => g.lost().await, None => std::future::pending().await } } => {
                    run.name_lost().await;
                }
                () = async { if let Some(d) = drain_at { tokio::time::sleep_until(d).await } }, if drain_at.is_some() => {
                    run.drain.stop_all(&run.ctx);
                }
                _ = beat.tick() => run.beat().await,
                _ = recover.tick() => run.recover().await,
                // Only while a task could be taken: a full worker is woken by its tasks' ends.
                () = self.queue.changed(IDLE_POLL), if run.can_claim() => {}
            }
        }
        drop(cleaner);
        run.stopped().await;
        Ok(())
    }

    /// Takes the name lease back after it was lost (a pause past its TTL, a store out of reach)
    /// at `since`: `false` when it is still held, by its previous lease of this worker's or by a
    /// second worker under this name, as long as a start waits for it ([`Self::name_wait`]):
    /// then drain. Until it is taken back (tried again at each heartbeat) no claim is given back
    /// as unknown.
    async fn retake_name(
        &self,
        ctx: &Ctx,
        lease: &mut Option<crate::guard::LeaseGuard>,
        since: Instant,
    ) -> bool {
        let key = format!("{WORKER_KEY_PREFIX}{}", ctx.worker);
        let attempt = match self.locks.lock(&key) {
            Ok(b) => b.ttl(self.opts.ttl).try_acquire().await,
            Err(e) => Err(e),
        };
        match attempt {
            Ok(Some(g)) => {
                tracing::info!(key = %key, "this worker's name lease was lost and is taken back");
                *lease = Some(g);
                true
            }
            Ok(None) if since.elapsed() < self.name_wait() => true,
            Ok(None) => {
                ctx.report(&format!(
                    "this worker's name lease ({key}) is held by another worker under the same name; claiming nothing more and draining"
                ));
                false
            }
            Err(e) => {
                ctx.report(&format!(
                    "cannot take this worker's name lease ({key}) back: {e}"
                ));
                true
            }
        }
    }

    /// How long a worker waits for its name lease: a previous lease of the name lapses within it.
    fn name_wait(&self) -> Duration {
        self.opts.ttl * 2 + Duration::from_secs(1)
    }

    /// Takes the lease on this worker's name (see [Identity](self#identity)), waiting for a
    /// previous life's to run out.
    async fn take_name(&self, worker: &str) -> Result<crate::guard::LeaseGuard> {
        let key = format!("{WORKER_KEY_PREFIX}{worker}");
        let wait = self.name_wait();
        match self.locks.lock(&key)?.ttl(self.opts.ttl).wait(wait).acquire().await {
            Err(Error::Timeout { holder, .. }) => Err(Error::option(
                "worker name",
                format!(
                    "another live worker runs under the name {worker:?}: the lease on {key} is held \
                     by {holder} and was not freed within {wait:?}; give each worker a name of its own \
                     (POD_NAME, or Locks::with_holder)"
                ),
            )),
            other => other,
        }
    }
}

/// A running worker's loop state: its tasks' runners, its name lease, its drain.
struct Rounds<'a, R> {
    worker: &'a Worker,
    ctx: Arc<Ctx>,
    runner: Arc<R>,
    req: ClaimRequest,
    runners: JoinSet<()>,
    /// The name lease; `None` while it is lost and not yet taken back, since `name_lost`.
    name_lease: Option<crate::guard::LeaseGuard>,
    name_lost: Instant,
    drain: Drain,
}

impl<'a, R: TaskRunner> Rounds<'a, R> {
    fn new(
        worker: &'a Worker,
        name: Arc<str>,
        runner: Arc<R>,
        name_lease: Option<crate::guard::LeaseGuard>,
    ) -> Self {
        let ctx = Arc::new(Ctx {
            queue: worker.queue.clone(),
            locks: worker.locks.clone(),
            worker: name.clone(),
            ttl: worker.opts.ttl,
            lease_wait: worker.opts.lease_wait_period(),
            stop_grace: worker.opts.stop_grace,
            stops: Mutex::new(HashMap::new()),
            metrics: worker.metrics.clone(),
            report: worker.report.clone(),
        });
        Rounds {
            req: ClaimRequest {
                worker: name.to_string(),
                max_running: worker.opts.slots,
                group_limit: worker.opts.group_limit,
                ttl: worker.opts.ttl,
            },
            worker,
            ctx,
            runner,
            runners: JoinSet::new(),
            name_lease,
            name_lost: Instant::now(),
            drain: Drain::default(),
        }
    }

    fn drain(&mut self, phase: Phase) {
        let running = self.runners.len();
        self.drain
            .apply(phase, &self.ctx, self.worker.opts.drain_timeout, running);
    }

    /// Whether a task could be claimed now.
    fn can_claim(&self) -> bool {
        !self.drain.started() && self.runners.len() < self.worker.opts.slots as usize
    }

    /// Claims tasks into the free slots and starts their runs.
    async fn fill_slots(&mut self) {
        while self.can_claim() {
            match self.worker.queue.claim(&self.req).await {
                Ok(Some(task)) => {
                    let (tx, rx) = watch::channel(None);
                    self.ctx.stops.lock().insert(task.id, tx);
                    // Every log line of the task's run names it.
                    let span = tracing::info_span!("leasehold.task", id = task.id, key = %task.key);
                    let run = task::run(self.ctx.clone(), self.runner.clone(), task, rx);
                    self.runners.spawn(run.instrument(span));
                }
                Ok(None) => break,
                Err(e) => {
                    self.ctx.report(&format!("cannot claim a task: {e}"));
                    break;
                }
            }
        }
    }

    /// With no task running: whether the worker is done (drained, or idle with
    /// [`Worker::exit_when_idle`] and nothing left in the queue).
    async fn done(&self) -> bool {
        if self.drain.started() {
            return true;
        }
        if !self.worker.opts.exit_when_idle {
            return false;
        }
        match self.worker.queue.status().await {
            Ok(s) => s.running == 0 && s.pending.high + s.pending.normal + s.pending.low == 0,
            Err(e) => {
                self.ctx
                    .report(&format!("cannot read the queue status: {e}"));
                false
            }
        }
    }

    /// The name lease was lost: take it back, or drain.
    async fn name_lost(&mut self) {
        self.name_lease = None;
        self.name_lost = Instant::now();
        if !self
            .worker
            .retake_name(&self.ctx, &mut self.name_lease, self.name_lost)
            .await
        {
            self.drain(Phase::Draining);
        }
    }

    /// The heartbeat: the tasks this worker runs (claims are made by the loop, so none is in
    /// flight meanwhile), the queue's asks to stop some, the name lease taken back, unknown
    /// claims given back.
    async fn beat(&mut self) {
        let ctx = &self.ctx;
        let w = self.worker;
        let running: Vec<u64> = ctx.stops.lock().keys().copied().collect();
        match w
            .queue
            .heartbeat(&ctx.worker, w.opts.slots, w.opts.ttl, &running)
            .await
        {
            Ok(asks) => {
                for (id, why) in asks {
                    let why = match why {
                        CancelReason::Timeout => TaskStop::Timeout,
                        _ => TaskStop::Cancelled,
                    };
                    ctx.stop(id, why);
                }
            }
            Err(e) => ctx.report(&format!("heartbeat failed: {e}")),
        }
        if self.name_lease.is_none()
            && !self.drain.started()
            && !w
                .retake_name(&self.ctx, &mut self.name_lease, self.name_lost)
                .await
        {
            self.drain(Phase::Draining);
        }
        if self.name_lease.is_some() {
            give_back_unknown_claims(&self.ctx).await;
        }
    }

    /// The queue's recovery of dead workers' tasks.
    async fn recover(&self) {
        match self.worker.queue.recover(self.worker.opts.aging).await {
            Ok(r) => {
                if let Some(m) = &self.ctx.metrics {
                    m.recovered(&r);
                }
                for id in &r.requeued {
                    tracing::warn!(task = id, "a dead worker's task was requeued");
                }
                for id in &r.failed {
                    tracing::warn!(task = id, "a dead worker's task was marked failed");
                }
            }
            Err(e) => self.ctx.report(&format!("queue recovery failed: {e}")),
        }
    }

    /// The worker's end: deregistered, its name lease released.
    async fn stopped(self) {
        let worker = &self.ctx.worker;
        if let Err(e) = self.worker.queue.deregister(worker).await {
            tracing::debug!(error = %e, "could not deregister");
        }
        if let Some(g) = &self.name_lease {
            if let Err(e) = g.release().await {
                tracing::debug!(error = %e, "could not release the worker's name lease");
            }
        }
        tracing::info!(worker = %worker, "worker stopped");
    }
}

/// The worker's shutdown, as its loop sees it.
#[derive(Debug, Default)]
struct Drain {
    /// When the running tasks are told to stop, once draining.
    until: Option<Instant>,
    /// Whether they were told.
    stopped: bool,
}

impl Drain {
    fn started(&self) -> bool {
        self.until.is_some()
    }

    /// The drain deadline still to act on.
    fn deadline(&self) -> Option<Instant> {
        self.until.filter(|_| !self.stopped)
    }

    /// Acts on the shutdown `phase`, with `running` tasks running.
    fn apply(&mut self, phase: Phase, ctx: &Ctx, timeout: Duration, running: usize) {
        if phase == Phase::Working {
            return;
        }
        if self.until.is_none() {
            tracing::info!(running, "draining");
            self.until = Some(Instant::now() + timeout);
        }
        if phase == Phase::Stopping {
            self.stop_all(ctx);
        }
    }

    fn stop_all(&mut self, ctx: &Ctx) {
        if !self.stopped {
            self.stopped = true;
            ctx.stop_all(TaskStop::Shutdown);
        }
    }
}

/// What every task's run shares.
struct Ctx {
    queue: Arc<dyn QueueBackend>,
    locks: Locks,
    worker: Arc<str>,
    ttl: Duration,
    lease_wait: Duration,
    stop_grace: Duration,
    /// The tasks this worker runs (claimed, until their end is recorded or they were given
    /// back), each with the sender of its stop signal.
    stops: Mutex<HashMap<u64, watch::Sender<Option<TaskStop>>>>,
    metrics: Option<QueueMetrics>,
    report: Option<Report>,
}

impl Ctx {
    /// Tells task `id` to stop, unless it was told already (the first reason stands).
    fn stop(&self, id: u64, why: TaskStop) {
        if let Some(tx) = self.stops.lock().get(&id) {
            tx.send_if_modified(|cur| {
                let first = cur.is_none();
                if first {
                    *cur = Some(why);
                }
                first
            });
        }
    }

    fn stop_all(&self, why: TaskStop) {
        let ids: Vec<u64> = self.stops.lock().keys().copied().collect();
        for id in ids {
            self.stop(id, why.clone());
        }
    }

    /// A problem the worker goes on from.
    fn report(&self, problem: &str) {
        match &self.report {
            Some(report) => report(problem),
            None => tracing::warn!("{problem}"),
        }
    }
}

/// Aborts a spawned task when dropped (the cleanup task, when `run` ends or is dropped).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Deletes the tasks that ended at least `older` ago, now and then every hour (every `older`, if
/// shorter, at least a second apart). A failure is reported and tried at the next round.
async fn clean_up(ctx: Arc<Ctx>, older: Duration) {
    let every = older.clamp(Duration::from_secs(1), Duration::from_secs(3600));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match ctx.queue.cleanup(older).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "ended tasks deleted"),
            Err(e) => ctx.report(&format!("queue cleanup failed: {e}")),
        }
    }
}

/// Gives back to the queue the claims the database names this worker's but the worker never
/// heard of (a claim whose answer was lost: the connection ended, or the call's bound ran out,
/// after the commit), which its heartbeats would otherwise keep for as long as it lives, holding
/// their keys and slots. Only claims never started: a started task is one this worker ran.
/// Claims are made by the worker's main loop, as this is, so none is in flight meanwhile; a task
/// leaves `stops` only once its run has ended it or given it back.
async fn give_back_unknown_claims(ctx: &Ctx) {
    let claims = match ctx.queue.claims(&ctx.worker).await {
        Ok(claims) => claims,
        Err(e) => return ctx.report(&format!("cannot read this worker's claims: {e}")),
    };
    for (id, _) in claims
        .into_iter()
        .filter(|(id, started)| !started && !ctx.stops.lock().contains_key(id))
    {
        tracing::warn!(
            task = id,
            "a claim this worker never heard of (its answer was lost) goes back to the queue"
        );
        if let Err(e) = ctx.queue.unclaim(id, &ctx.worker).await {
            ctx.report(&format!("cannot give task {id} back to the queue: {e}"));
        }
    }
}
