//! `leasehold queue work`: claims tasks, runs each as a child process under its key's lease.
//!
//! One loop claims tasks while slots are free, heartbeats (renewing this worker's claims and
//! learning of cancel requests), and recovers the queue (dead workers' tasks, timeouts, aging).
//! Each claimed task gets its own runner: take the key's lease (waiting up to --lease-wait, else
//! give the task back), record the fence, run the command, stop it on cancel / timeout / lost
//! lease, record the outcome, release the lease.

use crate::child::{die_with_parent, stop_child};
use crate::cli::QueueWorkArgs;
use crate::exit::{self, Failure, OK};
use crate::metrics::Endpoint;
use crate::payload::decode_command;
use crate::signals::{self, Forwarded};
use crate::supervise;
use crate::tree;
use leasehold::queue::metrics::QueueMetrics;
use leasehold::queue::{CancelReason, ClaimRequest, Outcome, QueueBackend, Task};
use leasehold::{Error, Locks};
use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::Instrument;

/// Why a runner must stop its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Cancelled by an operator.
    Cancelled,
    /// Past its timeout.
    Timeout,
    /// The worker drains and the drain deadline passed.
    Drain,
}

/// What every runner shares.
struct Ctx {
    queue: Arc<dyn QueueBackend>,
    locks: Locks,
    worker: String,
    ttl: Duration,
    lease_wait: Duration,
    grace: Duration,
    stops: Mutex<HashMap<u64, watch::Sender<Option<Stop>>>>,
    /// The running tasks' supervisors (pids), each named here as it is started, under this lock.
    /// The worker is the subreaper of their descendants, so what a supervisor that died (killed
    /// with SIGKILL) left running becomes the worker's child; every other child is such a
    /// leftover, and is killed ([`tree::sweep_except`]) before the task's end is recorded.
    supervisors: Mutex<HashSet<u32>>,
    /// With `--metrics`.
    metrics: Option<QueueMetrics>,
}

impl Ctx {
    fn stop(&self, id: u64, why: Stop) {
        let stops = lock(&self.stops);
        if let Some(tx) = stops.get(&id) {
            tx.send_if_modified(|cur| {
                if cur.is_none() {
                    *cur = Some(why);
                    true
                } else {
                    false
                }
            });
        }
    }

    fn stop_all(&self, why: Stop) {
        let ids: Vec<u64> = lock(&self.stops).keys().copied().collect();
        for id in ids {
            self.stop(id, why);
        }
    }
}

/// `leasehold queue work`.
pub(crate) async fn work(
    queue: Arc<dyn QueueBackend>,
    store_url: Option<&str>,
    args: QueueWorkArgs,
) -> Result<u8, Failure> {
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    if args.ttl < Duration::from_millis(30) {
        return Err(Failure::usage("--ttl must be at least 30ms"));
    }
    // What a task supervisor killed with SIGKILL leaves becomes ours, to end ([`Ctx::supervisors`]).
    if let Err(e) = tree::become_subreaper() {
        tracing::warn!(error = %e, "cannot become the task supervisors' subreaper; what a killed supervisor leaves may outlive its task");
    }
    let endpoint = Endpoint::given(args.metrics);
    let locks = crate::metrics::locks(store_url, endpoint.as_ref()).await?;
    let metrics = match endpoint {
        Some(endpoint) => {
            let m = QueueMetrics::register("leasehold", &endpoint.registry)
                .map_err(crate::metrics::setup_failed)?;
            let (q, observed) = (queue.clone(), m.clone());
            endpoint
                .serve(move || {
                    let (q, observed) = (q.clone(), observed.clone());
                    async move {
                        match q.status().await {
                            Ok(s) => observed.observe(&s),
                            Err(e) => {
                                tracing::warn!(error = %e, "metrics: cannot read the queue status")
                            }
                        }
                    }
                })
                .await?;
            Some(m)
        }
        None => None,
    };
    let worker = locks.holder().as_str().to_owned();
    let ctx = Arc::new(Ctx {
        queue: queue.clone(),
        locks: locks.clone(),
        worker: worker.clone(),
        ttl: args.ttl,
        lease_wait: args.lease_wait.unwrap_or(args.ttl * 2),
        grace: args.grace,
        stops: Mutex::new(HashMap::new()),
        supervisors: Mutex::new(HashSet::new()),
        metrics,
    });
    let req = ClaimRequest {
        worker: worker.clone(),
        max_running: args.slots,
        group_limit: args.group_limit,
        ttl: args.ttl,
    };
    queue.heartbeat(&worker, args.slots, args.ttl, &[]).await?;
    tracing::info!(worker = %worker, slots = args.slots, "worker started");

    let cleaner = args
        .cleanup_after
        .map(|older| tokio::spawn(clean_up(queue.clone(), older)));
    let mut runners: JoinSet<()> = JoinSet::new();
    let mut beat = tokio::time::interval(args.ttl / 3);
    let mut recover = tokio::time::interval((args.ttl / 2).min(Duration::from_secs(1)));
    let mut drain_until: Option<Instant> = None;
    let mut drain_stopped = false;
    loop {
        // Fill free slots.
        while drain_until.is_none() && runners.len() < args.slots as usize {
            match queue.claim(&req).await {
                Ok(Some(task)) => {
                    let (tx, rx) = watch::channel(None);
                    lock(&ctx.stops).insert(task.id, tx);
                    // Every log line of the task's run names it (LEASEHOLD_LOG=info).
                    let span = tracing::info_span!("leasehold.task", id = task.id, key = %task.key);
                    runners.spawn(run_task(ctx.clone(), task, rx).instrument(span));
                }
                Ok(None) => break,
                Err(e) => {
                    exit::report(&format!("cannot claim a task: {e}"));
                    break;
                }
            }
        }
        if runners.is_empty() {
            if drain_until.is_some() {
                break;
            }
            if args.exit_when_idle {
                match queue.status().await {
                    Ok(s)
                        if s.running == 0
                            && s.pending.high + s.pending.normal + s.pending.low == 0 =>
                    {
                        break
                    }
                    Ok(_) => {}
                    Err(e) => exit::report(&format!("cannot read the queue status: {e}")),
                }
            }
        }
        let drain_at = drain_until.filter(|_| !drain_stopped);
        tokio::select! {
            biased;
            sig = signals.recv() => {
                if drain_until.is_none() {
                    tracing::info!(signal = %signals::name(sig.signal), running = runners.len(), "draining");
                    drain_until = Some(Instant::now() + args.drain_timeout);
                } else {
                    // A second signal: stop the running tasks now.
                    ctx.stop_all(Stop::Drain);
                    drain_stopped = true;
                }
            }
            Some(_) = runners.join_next() => {}
            () = async { if let Some(d) = drain_at { tokio::time::sleep_until(d).await } }, if drain_at.is_some() => {
                ctx.stop_all(Stop::Drain);
                drain_stopped = true;
            }
            _ = beat.tick() => {
                // The tasks this worker runs: claims are made by this loop, so none is in
                // flight meanwhile.
                let running: Vec<u64> = lock(&ctx.stops).keys().copied().collect();
                match queue.heartbeat(&worker, args.slots, args.ttl, &running).await {
                    Ok(asks) => for (id, why) in asks {
                        ctx.stop(id, match why {
                            CancelReason::Timeout => Stop::Timeout,
                            _ => Stop::Cancelled,
                        });
                    },
                    Err(e) => exit::report(&format!("heartbeat failed: {e}")),
                }
                give_back_unknown_claims(&ctx).await;
            }
            _ = recover.tick() => match queue.recover(args.aging).await {
                Ok(r) => {
                    if let Some(m) = &ctx.metrics {
                        m.recovered(&r);
                    }
                    for id in &r.requeued { tracing::warn!(task = id, "a dead worker's task was requeued"); }
                    for id in &r.failed { tracing::warn!(task = id, "a dead worker's task was marked failed"); }
                }
                Err(e) => exit::report(&format!("queue recovery failed: {e}")),
            },
            // Only while a task could be taken: a full worker is woken by its tasks' ends.
            () = queue.changed(Duration::from_millis(200)),
                if drain_until.is_none() && runners.len() < args.slots as usize => {}
        }
    }
    if let Some(cleaner) = cleaner {
        cleaner.abort();
    }
    if let Err(e) = queue.deregister(&worker).await {
        tracing::debug!(error = %e, "could not deregister");
    }
    if let Err(e) = locks.release_all().await {
        exit::report(&format!("cannot release every lease: {e}"));
    }
    Ok(OK)
}

/// `--cleanup-after`: deletes the tasks that ended at least `older` ago, now and then every hour
/// (every `older`, if shorter, at least a second apart), on a task of its own so that a long
/// first cleanup holds up no claim or heartbeat. A failure is reported and tried at the next
/// round.
async fn clean_up(queue: Arc<dyn QueueBackend>, older: Duration) {
    let every = older.clamp(Duration::from_secs(1), Duration::from_secs(3600));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match queue.cleanup(older).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "ended tasks deleted"),
            Err(e) => exit::report(&format!("queue cleanup failed: {e}")),
        }
    }
}

/// Gives back to the queue the claims the database names this worker's but the worker never
/// heard of (a claim whose answer was lost: the connection ended, or the call's bound ran out,
/// after the commit), which its heartbeats would otherwise keep for as long as it lives, holding
/// their keys and slots. Only claims never started: a started task is one this worker ran.
/// Claims are made by the worker's main loop, as this is, so none is in flight meanwhile; a task
/// leaves `stops` only once its runner has ended it or given it back.
async fn give_back_unknown_claims(ctx: &Ctx) {
    let claims = match ctx.queue.claims(&ctx.worker).await {
        Ok(claims) => claims,
        Err(e) => return exit::report(&format!("cannot read this worker's claims: {e}")),
    };
    for (id, _) in claims
        .into_iter()
        .filter(|(id, started)| !started && !lock(&ctx.stops).contains_key(id))
    {
        tracing::warn!(
            task = id,
            "a claim this worker never heard of (its answer was lost) goes back to the queue"
        );
        if let Err(e) = ctx.queue.unclaim(id, &ctx.worker).await {
            exit::report(&format!("cannot give task {id} back to the queue: {e}"));
        }
    }
}

/// One task, start to end.
async fn run_task(ctx: Arc<Ctx>, task: Task, mut stop: watch::Receiver<Option<Stop>>) {
    let id = task.id;
    run_task_inner(&ctx, task, &mut stop).await;
    lock(&ctx.stops).remove(&id);
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
        Ok(false) => exit::report(&format!(
            "task {} was recovered by another worker before it ended here ({outcome:?} not recorded)",
            task.id
        )),
        Err(e) => exit::report(&format!(
            "cannot record the end of task {} ({outcome:?}): {e}",
            task.id
        )),
    }
}

async fn run_task_inner(ctx: &Ctx, task: Task, stop: &mut watch::Receiver<Option<Stop>>) {
    // Just claimed: its wait until it starts goes on from here, on this process's clock.
    let claimed = std::time::Instant::now();
    let argv = match decode_command(&task.payload) {
        Ok(argv) => argv,
        Err(e) => {
            exit::report(&format!("task {}: corrupt payload: {e}", task.id));
            return finish(
                ctx,
                &task,
                Outcome::Failed(format!("corrupt payload: {e}")),
                None,
            )
            .await;
        }
    };
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
            return finish(ctx, &task, Outcome::Cancelled("stopped while waiting for the key's lease".into()), None).await;
        }
    };
    let guard = match guard {
        Ok(g) => g,
        Err(e) => {
            if !matches!(e, Error::Timeout { .. }) {
                exit::report(&format!(
                    "task {}: cannot take the lease on {:?}: {e}",
                    task.id, task.key
                ));
            }
            if let Err(e) = ctx.queue.unclaim(task.id, &ctx.worker).await {
                exit::report(&format!("cannot give task {} back: {e}", task.id));
            }
            return;
        }
    };
    match ctx.queue.started(task.id, &ctx.worker, guard.fence()).await {
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
            exit::report(&format!("cannot record the start of task {}: {e}", task.id));
            let _ = guard.release().await;
            let _ = ctx.queue.unclaim(task.id, &ctx.worker).await;
            return;
        }
    }
    let started = Instant::now();
    let (mut child, report) = match supervised(ctx, &task, &argv, guard.fence()) {
        Ok(started) => started,
        Err(why) => {
            exit::report(&format!("task {}: {why}", task.id));
            finish(ctx, &task, Outcome::Failed(why), None).await;
            let _ = guard.release().await;
            return;
        }
    };
    let supervisor = child.id();
    let deadline = task
        .timeout_ms
        .map(|ms| Instant::now() + Duration::from_millis(ms));
    // The supervisor is told to stop (SIGTERM), passes it on and kills the task itself once the
    // grace has passed; it is killed only if it overruns.
    let grace = ctx.grace + supervise::OVERRUN;
    let outcome = tokio::select! {
        biased;
        status = child.wait() => match status {
            Ok(s) if s.success() => Outcome::Succeeded,
            Ok(s) => Outcome::Failed(match (s.code(), s.signal()) {
                (Some(c), _) => format!("exit status {c}"),
                (None, Some(sig)) => format!("killed by {}", signals::name(sig)),
                _ => "ended abnormally".into(),
            }),
            Err(e) => Outcome::Failed(format!("cannot wait for the command: {e}")),
        },
        reason = guard.lost() => {
            let _ = stop_child(&mut child, grace).await;
            Outcome::Failed(format!("the key's lease was lost: {reason}"))
        }
        _ = stop.changed() => {
            let why = *stop.borrow();
            let _ = stop_child(&mut child, grace).await;
            match why {
                Some(Stop::Timeout) => Outcome::Cancelled("timed out".into()),
                Some(Stop::Drain) => Outcome::Cancelled("stopped: the worker was shutting down".into()),
                _ => Outcome::Cancelled("cancelled".into()),
            }
        }
        () = async { if let Some(d) = deadline { tokio::time::sleep_until(d).await } }, if deadline.is_some() => {
            let _ = stop_child(&mut child, grace).await;
            Outcome::Cancelled("timed out".into())
        }
    };
    // The supervisor has ended (and been reaped). Killed before its own sweep, it left what the
    // task still runs to the worker: ended here, before the task's end is recorded and its key
    // passed on.
    if let Some(pid) = supervisor {
        lock(&ctx.supervisors).remove(&pid);
    }
    tree::sweep_except(tree::SWEEP_LIMIT, &ctx.supervisors).await;
    let outcome = match report.read() {
        Some(why) => {
            exit::report(&format!("task {}: {why}", task.id));
            Outcome::Failed(why)
        }
        None => outcome,
    };
    finish(ctx, &task, outcome, Some(started.elapsed())).await;
    if let Err(e) = guard.release().await {
        exit::report(&format!(
            "cannot release the lease on {:?}: {e}; it expires by its TTL",
            task.key
        ));
    }
}

/// Starts `argv` for `task` (its lease's fence `fence`) under a supervisor, so that what the task
/// leaves running ends with it, also when the worker is killed ([`supervise`]). The supervisor
/// gets a process group of its own (the signals stopping the task go to it alone), and starts
/// the command in another.
fn supervised(
    ctx: &Ctx,
    task: &Task,
    argv: &[String],
    fence: u64,
) -> Result<(tokio::process::Child, supervise::Report), String> {
    let (mut command, mut report) = supervise::command(argv, ctx.grace)
        .map_err(|e| format!("cannot prepare the task's supervisor: {e}"))?;
    command
        .env("LEASEHOLD_TASK_ID", task.id.to_string())
        .env("LEASEHOLD_KEY", &task.key)
        .env("LEASEHOLD_FENCE", fence.to_string())
        .env("LEASEHOLD_HOLDER", &ctx.worker)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    die_with_parent(&mut command);
    // Named as a supervisor as it starts: a sweep never takes it for a leftover.
    let spawned = {
        let mut supervisors = lock(&ctx.supervisors);
        let spawned = command.spawn();
        if let Some(pid) = spawned.as_ref().ok().and_then(|c| c.id()) {
            supervisors.insert(pid);
        }
        spawned
    };
    report.started();
    let child = spawned.map_err(|e| format!("cannot start the task's supervisor: {e}"))?;
    Ok((child, report))
}

/// Locks `m`, whatever a panicking holder left in it (a map or set stays usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
