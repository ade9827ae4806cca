//! `leasehold queue work`: the library's queue worker ([`leasehold::queue::worker`], which
//! claims, heartbeats, recovers, takes each key's lease and records each end) with a runner that
//! runs each task's command as a process, under a task supervisor ([`crate::process::supervise`]), and
//! stops it when the worker says so: on cancel, timeout or drain SIGTERM, SIGKILL after `--grace`;
//! when the key's lease must be given up (its stop-by deadline passed unrenewed) SIGTERM, and
//! SIGKILL the kill margin ([`crate::process::loss`]) before the lease's `valid_until`, or at once when
//! the store says the lease is gone, so that the task is gone before another worker can be
//! granted its key. SIGTERM/SIGINT/SIGHUP drain the worker; a second one stops the running tasks.

use crate::cli::QueueWorkArgs;
use crate::exit::{self, Failure, OK};
use crate::metrics::{self, Endpoint};
use crate::payload::decode_command;
use crate::process::child::{die_with_parent, sleep_until, stop_signal};
use crate::process::loss;
use crate::process::signals::{self, Forwarded};
use crate::process::supervise;
use crate::process::tree;
use leasehold::queue::metrics::QueueMetrics;
use leasehold::queue::worker::{RunningTask, TaskRunner, TaskStop, Worker};
use leasehold::queue::{Outcome, QueueBackend, Task};
use std::collections::HashSet;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Beyond the longest a process runner takes to stop its task (the grace, the supervisor's
/// overrun, the sweep), before the worker would drop it: never, in practice.
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// `leasehold queue work`.
pub(crate) async fn work(
    queue: Arc<dyn QueueBackend>,
    store_url: Option<&str>,
    args: QueueWorkArgs,
) -> Result<u8, Failure> {
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    // Refused before anything starts (a usage error: an option that cannot work).
    let options =
        args.worker_options(args.grace + supervise::OVERRUN + tree::SWEEP_LIMIT + STOP_MARGIN);
    options.validate()?;
    // What a task supervisor killed with SIGKILL leaves becomes ours, to end
    // ([`ProcessRunner::supervisors`]).
    if let Err(e) = tree::become_subreaper() {
        tracing::warn!(error = %e, "cannot become the task supervisors' subreaper; what a killed supervisor leaves may outlive its task");
    }
    let endpoint = Endpoint::given(args.metrics);
    let locks = metrics::locks(store_url, endpoint.as_ref()).await?;
    let queue_metrics = match endpoint {
        Some(endpoint) => {
            let m = QueueMetrics::register("leasehold", &endpoint.registry)
                .map_err(metrics::setup_failed)?;
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
    let (progress, bar) = show_progress(queue.clone());
    let mut worker = Worker::new(queue, locks.clone())
        .options(options)
        .on_problem(exit::report);
    if let Some(m) = queue_metrics {
        worker = worker.metrics(m);
    }
    let shutdown = worker.shutdown_handle();
    let runner = ProcessRunner {
        grace: args.grace,
        kill_margin: loss::kill_margin(args.ttl),
        supervisors: Mutex::new(HashSet::new()),
    };
    let run = worker.run(runner);
    tokio::pin!(run);
    loop {
        tokio::select! {
            biased;
            sig = signals.recv() => {
                if shutdown.is_requested() {
                    // A second signal: stop the running tasks now.
                    shutdown.stop();
                } else {
                    tracing::info!(signal = %signals::name(sig.signal), "shutting down");
                    shutdown.drain();
                }
            }
            done = &mut run => {
                done?;
                break;
            }
        }
    }
    progress.abort();
    bar.finish_and_clear();
    if let Err(e) = locks.release_all().await {
        exit::report(&format!("cannot release every lease: {e}"));
    }
    Ok(OK)
}

/// On a terminal, a bar of the tasks ended since the worker started against those ended, running
/// and pending (read from the queue every second); nothing when stderr is not a terminal. The
/// returned task draws it until aborted.
fn show_progress(
    queue: Arc<dyn QueueBackend>,
) -> (tokio::task::JoinHandle<()>, indicatif::ProgressBar) {
    let bar = crate::progress::bar(0, "[{bar:30}] {pos}/{len} tasks  {msg}", true);
    let drawn = bar.clone();
    let task = tokio::spawn(async move {
        let bar = drawn;
        if bar.is_hidden() {
            return;
        }
        let ended = |s: &leasehold::queue::Status| s.succeeded + s.failed + s.cancelled;
        let mut base = None;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let Ok(s) = queue.status().await else {
                continue;
            };
            let base = *base.get_or_insert_with(|| ended(&s));
            let done = ended(&s).saturating_sub(base);
            let pending = s.pending.high + s.pending.normal + s.pending.low;
            bar.set_length(done + s.running + pending);
            bar.set_position(done);
            bar.set_message(format!("{} running, {pending} pending", s.running));
        }
    });
    (task, bar)
}

/// Runs a task's command (its payload) as a child process under a task supervisor.
struct ProcessRunner {
    /// How long a task stopped by cancel, timeout or drain may take to exit after SIGTERM before
    /// SIGKILL.
    grace: Duration,
    /// How long before the key's lease's deadline a task stopped for its lease gets SIGKILL.
    kill_margin: Duration,
    /// The running tasks' supervisors (pids), each named here as it is started, under this lock.
    /// The worker is the subreaper of their descendants, so what a supervisor that died (killed
    /// with SIGKILL) left running becomes the worker's child; every other child is such a
    /// leftover, and is killed ([`tree::sweep_except`]) before the task's end is recorded.
    supervisors: Mutex<HashSet<u32>>,
}

impl TaskRunner for ProcessRunner {
    fn check(&self, task: &Task) -> Result<(), String> {
        decode_command(&task.payload)
            .map(drop)
            .map_err(|e| format!("corrupt payload: {e}"))
    }

    fn run(&self, task: RunningTask) -> impl Future<Output = Outcome> + Send {
        self.run_command(task)
    }
}

impl ProcessRunner {
    /// Runs the task's command to its end, or stops it when told to; returns once the command,
    /// its supervisor and whatever they left running are gone.
    async fn run_command(&self, task: RunningTask) -> Outcome {
        let id = task.task().id;
        let argv = match decode_command(&task.task().payload) {
            Ok(argv) => argv,
            Err(e) => return Outcome::Failed(format!("corrupt payload: {e}")),
        };
        let (mut child, report, deadlines) = match self.supervised(&task, &argv) {
            Ok(started) => started,
            Err(why) => {
                exit::report(&format!("task {id}: {why}"));
                return Outcome::Failed(why);
            }
        };
        let supervisor = child.id();
        // The supervisor is told to stop (SIGTERM), passes it on and kills the task itself once
        // the grace has passed; it is killed (SIGKILL, and the task's group with it) if it
        // overruns, or the kill margin before the key's lease's deadline.
        let grace = self.grace + supervise::OVERRUN;
        let mut stopped: Option<TaskStop> = None;
        let mut lease_by = task.deadline();
        let mut kill_at: Option<Instant> = None;
        let mut killed = false;
        // The supervisor is told each of the lease's deadlines, for a worker that is paused.
        let mut known = task.valid_until();
        self.tell_deadline(&deadlines, known);
        let status = loop {
            tokio::select! {
                biased;
                status = child.wait() => break status,
                why = task.stopped(), if stopped.is_none() => {
                    // The deadline as it is now: a lease the store says is gone moved it to now
                    // just before this stop, and a SIGTERM then would be an overlap.
                    if let Some(by) = task.deadline() {
                        lease_by = Some(by);
                    }
                    let now = Instant::now();
                    let mut at = now + grace;
                    if let Some(by) = lease_by {
                        at = at.min(loss::kill_before(by, self.kill_margin));
                    }
                    if at > now {
                        stop_signal(&child, libc::SIGTERM);
                    }
                    tracing::info!(task = id, reason = %why, "stopping the task");
                    kill_at = Some(at);
                    stopped = Some(why);
                }
                v = task.valid_until_changed(known) => {
                    known = v;
                    self.tell_deadline(&deadlines, v);
                }
                by = task.deadline_changed(lease_by) => {
                    lease_by = Some(by);
                    let at = loss::kill_before(by, self.kill_margin);
                    kill_at = kill_at.map(|k| k.min(at));
                }
                () = sleep_until(kill_at), if kill_at.is_some() && !killed => {
                    tracing::warn!(task = id, "the task did not exit in time; killing it");
                    stop_signal(&child, libc::SIGKILL);
                    killed = true;
                }
            }
        };
        // The task outlived the lease's validity without being told to stop: the worker was
        // paused (SIGSTOP, a freeze) and the group guard killed the command at the deadline.
        if stopped.is_none() && Instant::now() >= known {
            exit::report(&format!(
                "task {id}: the key's lease ran out while the worker could not act (paused?); the task was killed at its deadline"
            ));
            stopped = Some(TaskStop::LeaseLost(leasehold::LostReason::Expired));
        }
        let outcome = match (stopped, status) {
            (Some(why), _) => why.outcome(),
            (None, Ok(s)) if s.success() => Outcome::Succeeded,
            (None, Ok(s)) => Outcome::Failed(match (s.code(), s.signal()) {
                (Some(c), _) => format!("exit status {c}"),
                (None, Some(sig)) => format!("killed by {}", signals::name(sig)),
                _ => "ended abnormally".into(),
            }),
            (None, Err(e)) => Outcome::Failed(format!("cannot wait for the command: {e}")),
        };
        // The supervisor has ended (and been reaped). Killed before its own sweep, it left what
        // the task still runs to the worker: ended here, before the task's end is recorded and
        // its key passed on.
        if let Some(pid) = supervisor {
            lock(&self.supervisors).remove(&pid);
        }
        tree::sweep_except(tree::SWEEP_LIMIT, &self.supervisors).await;
        match report.read() {
            Some(why) => {
                exit::report(&format!("task {id}: {why}"));
                Outcome::Failed(why)
            }
            None => outcome,
        }
    }

    /// Tells a task's supervisor (on `pipe`, its stdin) that its key's lease is valid until
    /// `valid_until`: the command's group is killed then, less half the kill margin, unless told
    /// of a later one ([`supervise`]).
    fn tell_deadline(&self, pipe: &OwnedFd, valid_until: Instant) {
        let at = crate::process::group_guard::monotonic_at(loss::watchdog(
            valid_until,
            self.kill_margin,
        ));
        if let Err(e) = crate::process::group_guard::write_deadline(pipe, at) {
            tracing::warn!(error = %e, "cannot tell the task's supervisor the lease's deadline");
        }
    }

    /// Starts `argv` for `task` under a supervisor, so that what the task leaves running ends
    /// with it, also when the worker is killed ([`supervise`]). The supervisor gets a process
    /// group of its own (the signals stopping the task go to it alone), and starts the command in
    /// another.
    fn supervised(
        &self,
        task: &RunningTask,
        argv: &[String],
    ) -> Result<(tokio::process::Child, supervise::Report, OwnedFd), String> {
        let (mut command, mut report) = supervise::command(argv, self.grace)
            .map_err(|e| format!("cannot prepare the task's supervisor: {e}"))?;
        // The lease's deadlines go to the supervisor's stdin.
        let (read, write) = crate::process::group_guard::pipe(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .map_err(|e| format!("cannot prepare the task's supervisor: {e}"))?;
        command
            .env("LEASEHOLD_TASK_ID", task.task().id.to_string())
            .env("LEASEHOLD_KEY", &task.task().key)
            .env("LEASEHOLD_FENCE", task.fence().to_string())
            .env("LEASEHOLD_HOLDER", task.worker())
            .stdin(std::process::Stdio::from(read))
            .kill_on_drop(true)
            .process_group(0);
        die_with_parent(&mut command);
        // Named as a supervisor as it starts: a sweep never takes it for a leftover.
        let spawned = {
            let mut supervisors = lock(&self.supervisors);
            let spawned = command.spawn();
            if let Some(pid) = spawned.as_ref().ok().and_then(|c| c.id()) {
                supervisors.insert(pid);
            }
            spawned
        };
        report.started();
        let child = spawned.map_err(|e| format!("cannot start the task's supervisor: {e}"))?;
        Ok((child, report, write))
    }
}

/// Locks `m`, whatever a panicking holder left in it (a set stays usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
