//! One task's run, from its claim to its recorded end: the check, the key's lease, the start
//! recorded with the fence, the runner run and stopped, the end recorded, the lease released.

use super::{Ctx, RunningTask, TaskRunner, TaskStop};
use crate::error::Error;
use crate::guard::LeaseGuard;
use crate::queue::{Outcome, Task};
use crate::store::LostReason;
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Removes a task from the worker's running set when its run ends, however it ends.
struct Running<'a> {
    ctx: &'a Ctx,
    id: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.ctx.stops.lock().remove(&self.id);
    }
}

/// One task, from its claim to its recorded end.
pub(super) async fn run<R: TaskRunner>(
    ctx: Arc<Ctx>,
    runner: Arc<R>,
    task: Task,
    mut stop: watch::Receiver<Option<TaskStop>>,
) {
    let _running = Running {
        ctx: &ctx,
        id: task.id,
    };
    run_claimed(&ctx, &*runner, task, &mut stop).await;
}

/// Records the end of `task` with `outcome`, after it ran for `ran` (`None`: it never started).
/// Counted in the metrics only once recorded: a task another worker recovered meanwhile (or whose
/// end cannot be recorded, which a later recovery acts on) is counted where it is recovered.
async fn finish(ctx: &Ctx, task: &Task, outcome: Outcome, ran: Option<Duration>) {
    match ctx.queue.finish(task.id, &ctx.worker, &outcome).await {
        Ok(true) => {
            if let Some(m) = &ctx.metrics {
                m.finished(&outcome, ran);
            }
            tracing::info!(task = task.id, key = %task.key, outcome = ?outcome, "task ended");
        }
        Ok(false) => ctx.report(&format!(
            "task {} was recovered by another worker before it ended here ({outcome:?} not recorded)",
            task.id
        )),
        Err(e) => ctx.report(&format!(
            "cannot record the end of task {} ({outcome:?}): {e}",
            task.id
        )),
    }
}

async fn run_claimed<R: TaskRunner>(
    ctx: &Ctx,
    runner: &R,
    task: Task,
    stop: &mut watch::Receiver<Option<TaskStop>>,
) {
    // Just claimed: its wait until it starts goes on from here, on this process's clock.
    let claimed = std::time::Instant::now();
    let Some(guard) = take_lease(ctx, runner, &task, stop).await else {
        return;
    };
    if !record_start(ctx, &task, &guard, claimed).await {
        return;
    }
    let started = Instant::now();
    let outcome = Supervised::new(ctx, &task, &guard, started)
        .run(runner, stop)
        .await;
    finish(ctx, &task, outcome, Some(started.elapsed())).await;
    if let Err(e) = guard.release().await {
        ctx.report(&format!(
            "cannot release the lease on {:?}: {e}; it expires by its TTL",
            task.key
        ));
    }
}

/// Checks the claimed task and takes its key's lease; `None` when the task ended here (failed
/// its check, cancelled while waiting) or was given back (no lease within the wait).
async fn take_lease<R: TaskRunner>(
    ctx: &Ctx,
    runner: &R,
    task: &Task,
    stop: &mut watch::Receiver<Option<TaskStop>>,
) -> Option<LeaseGuard> {
    if let Err(why) = runner.check(task) {
        ctx.report(&format!("task {}: {why}", task.id));
        finish(ctx, task, Outcome::Failed(why), None).await;
        return None;
    }
    let builder = match ctx.locks.lock(&task.key) {
        Ok(b) => b
            .ttl(ctx.ttl)
            .wait(ctx.lease_wait)
            .label("task", task.id.to_string()),
        Err(e) => {
            finish(ctx, task, Outcome::Failed(e.to_string()), None).await;
            return None;
        }
    };
    let guard = tokio::select! {
        g = builder.acquire() => g,
        _ = stop.changed() => {
            let outcome = Outcome::Cancelled("stopped while waiting for the key's lease".into());
            finish(ctx, task, outcome, None).await;
            return None;
        }
    };
    match guard {
        Ok(g) => Some(g),
        Err(e) => {
            if !matches!(e, Error::Timeout { .. }) {
                ctx.report(&format!(
                    "task {}: cannot take the lease on {:?}: {e}",
                    task.id, task.key
                ));
            }
            if let Err(e) = ctx.queue.unclaim(task.id, &ctx.worker).await {
                ctx.report(&format!("cannot give task {} back: {e}", task.id));
            }
            None
        }
    }
}

/// Records the task's start with the lease's fence; false (the lease released, the task given
/// back when that can help) when it cannot start here.
async fn record_start(
    ctx: &Ctx,
    task: &Task,
    guard: &LeaseGuard,
    claimed: std::time::Instant,
) -> bool {
    match ctx.queue.started(task.id, &ctx.worker, guard.fence()).await {
        Ok(true) => {
            if let Some(m) = &ctx.metrics {
                m.started(task, claimed.elapsed());
            }
            true
        }
        // Recovered by another worker meanwhile.
        Ok(false) => {
            let _ = guard.release().await;
            false
        }
        Err(e) => {
            ctx.report(&format!("cannot record the start of task {}: {e}", task.id));
            let _ = guard.release().await;
            let _ = ctx.queue.unclaim(task.id, &ctx.worker).await;
            false
        }
    }
}

/// A started task's runner under watch: its timeout, the key's lease (stop it when the lease
/// must be given up; feed it each `valid_until`), the worker's stop and the stop grace.
struct Supervised<'a> {
    ctx: &'a Ctx,
    task: &'a Task,
    guard: &'a LeaseGuard,
    /// When the task's own timeout stops it (`None`: none, or passed).
    deadline: Option<Instant>,
    /// Set once the key's lease must be given up: by when the runner must be gone.
    lease_deadline: watch::Sender<Option<Instant>>,
    /// The lease's `valid_until`, as renewals move it.
    valid_until: watch::Sender<Instant>,
    known: Instant,
    /// Once the key's lease must be given up (its stop-by deadline passed unrenewed, or the
    /// store said it is gone): when a runner still running is dropped, the lease's
    /// `valid_until`, or now if that has passed. (A runner told that the lease is gone is told
    /// to be gone at once, [`RunningTask::deadline`]; the time to its `valid_until` lets a
    /// process runner that killed its process at once see it and what it left gone.)
    lease_stop: Option<Instant>,
    lost_seen: bool,
    /// Once told to stop: by when the runner must have returned (the stop grace).
    drop_at: Option<Instant>,
}

impl<'a> Supervised<'a> {
    fn new(ctx: &'a Ctx, task: &'a Task, guard: &'a LeaseGuard, started: Instant) -> Self {
        let known = guard.valid_until();
        Supervised {
            ctx,
            task,
            guard,
            deadline: task
                .timeout_ms
                .map(|ms| started + Duration::from_millis(ms)),
            lease_deadline: watch::channel(None).0,
            valid_until: watch::channel(known).0,
            known,
            lease_stop: None,
            lost_seen: false,
            drop_at: None,
        }
    }

    /// Runs the task's runner to its outcome. The runner's future lives in this call only: a
    /// runner that is dropped is gone before the task's end is recorded and its lease released.
    async fn run<R: TaskRunner>(
        mut self,
        runner: &R,
        stop: &mut watch::Receiver<Option<TaskStop>>,
    ) -> Outcome {
        let fence = self.guard.fence();
        let running = RunningTask::new(
            Task {
                fence: Some(fence),
                ..self.task.clone()
            },
            fence,
            self.ctx.worker.clone(),
            stop.clone(),
            self.lease_deadline.subscribe(),
            self.valid_until.subscribe(),
        );
        // Called inside the caught future: a closure that panics before its first `.await`
        // fails the task as one that panics later does.
        let run = AssertUnwindSafe(async { runner.run(running).await }).catch_unwind();
        tokio::pin!(run);
        let guard = self.guard;
        loop {
            let drop_by = match (self.drop_at, self.lease_stop) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                biased;
                ran = &mut run => return ran.unwrap_or_else(|panic| self.panicked(&*panic)),
                why = guard.must_stop(), if self.lease_stop.is_none() => self.must_stop(&why),
                // Told to stop while renewals failed, then lost: the store may say it is gone.
                reason = guard.lost(), if self.lease_stop.is_some() && !self.lost_seen => {
                    self.lost(reason)
                }
                Some(v) = guard.valid_until_changed(self.known) => {
                    self.known = v;
                    self.valid_until.send_replace(v);
                }
                () = sleep_until(self.deadline), if self.deadline.is_some() => {
                    self.deadline = None;
                    self.ctx.stop(self.task.id, TaskStop::Timeout);
                }
                _ = stop.changed(), if self.drop_at.is_none() => {
                    if stop.borrow_and_update().is_some() {
                        self.drop_at = Some(Instant::now() + self.ctx.stop_grace);
                    }
                }
                () = sleep_until(drop_by), if drop_by.is_some() => {
                    let why = stop.borrow().clone().unwrap_or(TaskStop::Shutdown);
                    return self.dropped(why);
                }
            }
        }
    }

    fn panicked(&self, panic: &(dyn std::any::Any + Send)) -> Outcome {
        let why = panic_message(panic);
        self.ctx.report(&format!(
            "task {}: the task runner panicked: {why}",
            self.task.id
        ));
        Outcome::Failed(format!("the task runner panicked: {why}"))
    }

    /// The key's lease must be given up: the runner is told, with by when it must be gone.
    fn must_stop(&mut self, why: &crate::guard::StopReason) {
        let (reason, by) = lease_stop_reason(why, self.guard.valid_until());
        self.lease_stop = Some(self.guard.valid_until());
        self.lease_deadline.send_replace(Some(by));
        tracing::info!(reason = %why, "the key's lease must be given up; stopping the task");
        self.ctx.stop(self.task.id, TaskStop::LeaseLost(reason));
    }

    /// The lease was lost after the runner was told to stop: if the store says it is gone, the
    /// runner must be gone now.
    fn lost(&mut self, reason: LostReason) {
        self.lost_seen = true;
        let (_, by) = lease_stop_reason(
            &crate::guard::StopReason::Lost(reason),
            self.guard.valid_until(),
        );
        self.lease_deadline.send_if_modified(|cur| {
            let sooner = cur.is_some_and(|c| by < c);
            if sooner {
                *cur = Some(by);
            }
            sooner
        });
    }

    /// The runner outlived the lease or its stop grace: it is dropped, and the task ends as
    /// `why` says.
    fn dropped(&self, why: TaskStop) -> Outcome {
        let id = self.task.id;
        if self
            .lease_stop
            .is_some_and(|l| self.drop_at.is_none_or(|d| l <= d))
        {
            self.ctx.report(&format!(
                "task {id}: its runner was still running when the key's lease could expire ({why}); dropped"
            ));
        } else {
            self.ctx.report(&format!(
                "task {id}: its runner did not return within {:?} of being told to stop ({why}); dropped",
                self.ctx.stop_grace
            ));
        }
        why.outcome()
    }
}

/// Sleeps until `at`; never, for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The worker's stop reason for a lease that must be given up (`why`, from
/// [`LeaseGuard::must_stop`](crate::LeaseGuard::must_stop)), and by when the runner must be gone:
/// the lease's `valid_until` while it may still be valid, now when the store said it is gone.
fn lease_stop_reason(
    why: &crate::guard::StopReason,
    valid_until: Instant,
) -> (LostReason, Instant) {
    match why {
        crate::guard::StopReason::RenewalsFailing { valid_until } => (
            LostReason::Unreachable {
                detail: why.to_string(),
            },
            *valid_until,
        ),
        crate::guard::StopReason::Lost(reason) if reason.is_gone() => {
            (reason.clone(), Instant::now())
        }
        crate::guard::StopReason::Lost(reason) => (reason.clone(), valid_until),
    }
}

/// The text of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}
