//! One task's run, from its claim to its recorded end: the check, the key's lease, the start
//! recorded with the fence, the runner run and stopped, the end recorded, the lease released.

use super::{Ctx, RunningTask, StopReason, TaskRunner};
use crate::error::Error;
use crate::queue::{Outcome, Task};
use crate::LostReason;
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
    mut stop: watch::Receiver<Option<StopReason>>,
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
    stop: &mut watch::Receiver<Option<StopReason>>,
) {
    // Just claimed: its wait until it starts goes on from here, on this process's clock.
    let claimed = std::time::Instant::now();
    if let Err(why) = runner.check(&task) {
        ctx.report(&format!("task {}: {why}", task.id));
        return finish(ctx, &task, Outcome::Failed(why), None).await;
    }
    let builder = match ctx.locks.lock(&task.key) {
        Ok(b) => b
            .ttl(ctx.ttl)
            .wait(ctx.lease_wait)
            .label("task", task.id.to_string()),
        Err(e) => return finish(ctx, &task, Outcome::Failed(e.to_string()), None).await,
    };
    let guard = tokio::select! {
        g = builder.acquire() => g,
        _ = stop.changed() => {
            let outcome = Outcome::Cancelled("stopped while waiting for the key's lease".into());
            return finish(ctx, &task, outcome, None).await;
        }
    };
    let guard = match guard {
        Ok(g) => g,
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
            return;
        }
    };
    let fence = guard.fence();
    match ctx.queue.started(task.id, &ctx.worker, fence).await {
        Ok(true) => {
            if let Some(m) = &ctx.metrics {
                m.started(&task, claimed.elapsed());
            }
        }
        Ok(false) => {
            let _ = guard.release().await;
            return;
        }
        Err(e) => {
            ctx.report(&format!("cannot record the start of task {}: {e}", task.id));
            let _ = guard.release().await;
            let _ = ctx.queue.unclaim(task.id, &ctx.worker).await;
            return;
        }
    }
    let started = Instant::now();
    let mut deadline = task
        .timeout_ms
        .map(|ms| started + Duration::from_millis(ms));
    // Set once the key's lease must be given up: by when the runner must be gone.
    let (lease_deadline, lease_deadline_rx) = watch::channel(None);
    // The lease's `valid_until`, as renewals move it.
    let mut known = guard.valid_until();
    let (valid_until, valid_until_rx) = watch::channel(known);
    let running = RunningTask::new(
        Task {
            fence: Some(fence),
            ..task.clone()
        },
        fence,
        ctx.worker.clone(),
        stop.clone(),
        lease_deadline_rx,
        valid_until_rx,
    );
    // The runner's future lives in this block only: a runner that is dropped is gone before the
    // task's end is recorded and its lease released.
    let outcome = {
        // Called inside the caught future: a closure that panics before its first `.await`
        // fails the task as one that panics later does.
        let run = AssertUnwindSafe(async { runner.run(running).await }).catch_unwind();
        tokio::pin!(run);
        // Once the key's lease must be given up (its stop-by deadline passed unrenewed, or the
        // store said it is gone): when a runner still running is dropped, the lease's
        // `valid_until`, or now if that has passed. (A runner told that the lease is gone is
        // told to be gone at once, [`RunningTask::deadline`]; the time to its `valid_until` lets
        // a process runner that killed its process at once see it and what it left gone.)
        let mut lease_stop: Option<Instant> = None;
        let mut lost_seen = false;
        // Once told to stop: by when the runner must have returned (the stop grace).
        let mut drop_at: Option<Instant> = None;
        loop {
            let drop_by = match (drop_at, lease_stop) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                biased;
                ran = &mut run => break ran.unwrap_or_else(|panic| {
                    let why = panic_message(&*panic);
                    ctx.report(&format!("task {}: the task runner panicked: {why}", task.id));
                    Outcome::Failed(format!("the task runner panicked: {why}"))
                }),
                why = guard.must_stop(), if lease_stop.is_none() => {
                    let (reason, by) = lease_stop_reason(&why, guard.valid_until());
                    lease_stop = Some(guard.valid_until());
                    lease_deadline.send_replace(Some(by));
                    tracing::info!(reason = %why, "the key's lease must be given up; stopping the task");
                    ctx.stop(task.id, StopReason::LeaseLost(reason));
                }
                // Told to stop while renewals failed, then lost: the store may say it is gone.
                reason = guard.lost(), if lease_stop.is_some() && !lost_seen => {
                    lost_seen = true;
                    let (_, by) = lease_stop_reason(&crate::StopReason::Lost(reason), guard.valid_until());
                    lease_deadline.send_if_modified(|cur| {
                        let sooner = cur.is_some_and(|c| by < c);
                        if sooner {
                            *cur = Some(by);
                        }
                        sooner
                    });
                }
                Some(v) = guard.valid_until_changed(known) => {
                    known = v;
                    valid_until.send_replace(v);
                }
                () = async { if let Some(d) = deadline { tokio::time::sleep_until(d).await } }, if deadline.is_some() => {
                    deadline = None;
                    ctx.stop(task.id, StopReason::Timeout);
                }
                _ = stop.changed(), if drop_at.is_none() => {
                    if stop.borrow_and_update().is_some() {
                        drop_at = Some(Instant::now() + ctx.stop_grace);
                    }
                }
                () = async { if let Some(d) = drop_by { tokio::time::sleep_until(d).await } }, if drop_by.is_some() => {
                    let why = stop.borrow().clone().unwrap_or(StopReason::Shutdown);
                    if lease_stop.is_some_and(|l| drop_at.is_none_or(|d| l <= d)) {
                        ctx.report(&format!(
                            "task {}: its runner was still running when the key's lease could expire ({why}); dropped",
                            task.id
                        ));
                    } else {
                        ctx.report(&format!(
                            "task {}: its runner did not return within {:?} of being told to stop ({why}); dropped",
                            task.id, ctx.stop_grace
                        ));
                    }
                    break why.outcome();
                }
            }
        }
    };
    finish(ctx, &task, outcome, Some(started.elapsed())).await;
    if let Err(e) = guard.release().await {
        ctx.report(&format!(
            "cannot release the lease on {:?}: {e}; it expires by its TTL",
            task.key
        ));
    }
}

/// The worker's stop reason for a lease that must be given up (`why`, from
/// [`LeaseGuard::must_stop`](crate::LeaseGuard::must_stop)), and by when the runner must be gone:
/// the lease's `valid_until` while it may still be valid, now when the store said it is gone.
fn lease_stop_reason(why: &crate::StopReason, valid_until: Instant) -> (LostReason, Instant) {
    match why {
        crate::StopReason::RenewalsFailing { valid_until } => (
            LostReason::Unreachable {
                detail: why.to_string(),
            },
            *valid_until,
        ),
        crate::StopReason::Lost(reason) if reason.is_gone() => (reason.clone(), Instant::now()),
        crate::StopReason::Lost(reason) => (reason.clone(), valid_until),
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
