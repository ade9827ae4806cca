//! The per-key serialised task queue for Python (`leasehold.queue`): the queue's calls (add,
//! status, cancel, get, list, cleanup) and a worker whose tasks run as coroutines on the asyncio
//! event loop it was started from.
//!
//! The worker is the library's [`Worker`](leasehold::queue::worker::Worker) with a
//! [`TaskRunner`] that hands each task to the Python layer (`leasehold/queue.py`) through four
//! hooks, each called with the GIL from the runtime's threads and each only scheduling work on
//! the loop (`call_soon_threadsafe`):
//!
//! - `start(task)`: run the handler for this [`QueueTask`]; the Python side reports the end with
//!   `task._finish(kind, detail)`;
//! - `cancel(id, reason)`: the library says stop (cancel, timeout, shutdown, or the key's lease
//!   must be given up at its stop-by deadline): cancel the coroutine;
//! - `abandoned(id, reason)`: the library dropped the run (the coroutine outlived the lease's
//!   `valid_until` or the stop grace, or the worker itself was dropped): forget the coroutine;
//! - `report(line)`: a problem the worker goes on from (its `on_problem`).

use crate::errors::{self, IntoPy};
use crate::run;
use leasehold::queue::worker::{RunningTask, Shutdown, TaskRunner, TaskStop};
use leasehold::queue::{open_queue as open, Cancelled, Outcome, Policy, Priority, QueueBackend};
use leasehold::{HolderId, LockOptions};
use pyo3::prelude::*;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// The queue the command uses without `--queue`: `LEASEHOLD_QUEUE`, else the library's default
/// (`sqlite://<state dir>/leasehold/queue.db`).
#[pyfunction]
fn default_queue_url() -> String {
    leasehold::defaults::queue_url_from_env()
}

/// The lease store a worker of the queue `queue_url` uses when none is named, as `leasehold
/// queue work` picks it: `LEASEHOLD_STORE`; else, for a PostgreSQL queue, the same database;
/// else the default file store.
#[pyfunction]
fn worker_store_url(queue_url: &str) -> PyResult<String> {
    leasehold::defaults::worker_store_url_from_env(queue_url).py()
}

/// Opens the queue at `url` (`sqlite:///path/queue.db` or `postgres://…`). Blocks with the GIL
/// released while the database is opened (and its schema created).
#[pyfunction]
fn open_queue(py: Python<'_>, url: String) -> PyResult<Queue> {
    let inner = run::block_all(py, async move { open(&url).await.py() })?;
    Ok(Queue { inner })
}

/// A queue: its tasks, their states, the workers' claims.
#[pyclass(module = "leasehold._native", frozen)]
struct Queue {
    inner: Arc<dyn QueueBackend>,
}

/// The binding's internal error for a value that cannot be written as JSON.
fn json_err(what: &'static str) -> impl Fn(serde_json::Error) -> PyErr {
    move |e| errors::internal(&format!("{what} to JSON: {e}"))
}

/// A count from Python (attempts, slots, a limit): refused unless it is 1 to `u32::MAX`.
fn count(name: &'static str, n: i64) -> PyResult<u32> {
    u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
        errors::invalid_option(name, format!("{n} is not a count from 1 to {}", u32::MAX))
    })
}

/// A task to add, filled once from `add`'s arguments (checked when enqueued, as the library
/// does).
#[pyclass(module = "leasehold._native", frozen)]
struct NewTask {
    inner: leasehold::queue::NewTask,
}

#[pymethods]
impl NewTask {
    #[new]
    #[pyo3(signature = (key, payload, *, priority="normal", group=None, timeout=None, policy="at-most-once", max_attempts=3))]
    fn new(
        key: String,
        payload: String,
        priority: &str,
        group: Option<String>,
        timeout: Option<run::Secs>,
        policy: &str,
        max_attempts: i64,
    ) -> PyResult<Self> {
        let mut task = leasehold::queue::NewTask::new(key, payload);
        task.priority = priority.parse::<Priority>().py()?;
        task.group = group;
        task.timeout = run::seconds("timeout", timeout)?;
        task.policy = match policy.trim().to_ascii_lowercase().as_str() {
            "at-most-once" => Policy::AtMostOnce,
            "at-least-once" => Policy::AtLeastOnce {
                max_attempts: count("max_attempts", max_attempts)?,
            },
            _ => {
                return Err(errors::invalid_option(
                    "policy",
                    format!("{policy:?} is not a policy (use at-most-once or at-least-once)"),
                ))
            }
        };
        Ok(NewTask { inner: task })
    }

    fn __repr__(&self) -> String {
        format!("NewTask(key={:?})", self.inner.key)
    }
}

/// `cancel`'s answer: `("cancelled", None)`, `("requested", None)` or `("already-ended", state)`.
fn cancelled(c: Cancelled) -> (String, Option<String>) {
    match c {
        Cancelled::Cancelled => ("cancelled".into(), None),
        Cancelled::Requested => ("requested".into(), None),
        Cancelled::AlreadyEnded(state) => ("already-ended".into(), Some(state.to_string())),
    }
}

impl Queue {
    fn add_fut(
        &self,
        task: &NewTask,
    ) -> impl Future<Output = PyResult<(u64, u64)>> + Send + 'static {
        let q = self.inner.clone();
        let task = task.inner.clone();
        async move {
            let done = q.enqueue(&task).await.py()?;
            Ok((done.id, done.position))
        }
    }

    fn status_fut(&self) -> impl Future<Output = PyResult<String>> + Send + 'static {
        let q = self.inner.clone();
        async move { serde_json::to_string(&q.status().await.py()?).map_err(json_err("status")) }
    }

    fn cancel_fut(
        &self,
        id: u64,
    ) -> impl Future<Output = PyResult<(String, Option<String>)>> + Send + 'static {
        let q = self.inner.clone();
        async move { q.cancel(id).await.py().map(cancelled) }
    }

    fn get_fut(&self, id: u64) -> impl Future<Output = PyResult<String>> + Send + 'static {
        let q = self.inner.clone();
        async move { serde_json::to_string(&q.get(id).await.py()?).map_err(json_err("task")) }
    }

    fn list_fut(
        &self,
        all: bool,
        limit: u64,
    ) -> impl Future<Output = PyResult<String>> + Send + 'static {
        let q = self.inner.clone();
        async move { serde_json::to_string(&q.list(all, limit).await.py()?).map_err(json_err("tasks")) }
    }

    fn cleanup_fut(
        &self,
        older_than: run::Secs,
    ) -> PyResult<impl Future<Output = PyResult<u64>> + Send + 'static> {
        let older = run::seconds("older_than", Some(older_than))?.unwrap_or_default();
        let q = self.inner.clone();
        Ok(async move { q.cleanup(older).await.py() })
    }
}

#[pymethods]
impl Queue {
    /// Adds a task (awaitable): `(id, position)`, its place in its key's line (1 = next).
    fn add<'py>(&self, py: Python<'py>, task: &NewTask) -> PyResult<Bound<'py, PyAny>> {
        run::awaitable(py, self.add_fut(task))
    }

    /// The blocking form of `add`.
    fn add_sync(&self, py: Python<'_>, task: &NewTask) -> PyResult<(u64, u64)> {
        run::block_all(py, self.add_fut(task))
    }

    /// The queue's status as JSON text, the one `leasehold queue status --json` prints
    /// (awaitable).
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run::awaitable(py, self.status_fut())
    }

    /// The blocking form of `status`.
    fn status_sync(&self, py: Python<'_>) -> PyResult<String> {
        run::block_all(py, self.status_fut())
    }

    /// Cancels task `id` (awaitable): `("cancelled", None)` when it was pending,
    /// `("requested", None)` when its worker was asked to stop it, `("already-ended", state)`.
    fn cancel<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        run::awaitable(py, self.cancel_fut(id))
    }

    /// The blocking form of `cancel`.
    fn cancel_sync(&self, py: Python<'_>, id: u64) -> PyResult<(String, Option<String>)> {
        run::block_all(py, self.cancel_fut(id))
    }

    /// Task `id` as JSON text (awaitable).
    fn get<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyAny>> {
        run::awaitable(py, self.get_fut(id))
    }

    /// The blocking form of `get`.
    fn get_sync(&self, py: Python<'_>, id: u64) -> PyResult<String> {
        run::block_all(py, self.get_fut(id))
    }

    /// Pending and running tasks (ended ones too with `all`), at most `limit`, as a JSON array
    /// (awaitable).
    #[pyo3(signature = (all=false, limit=1000))]
    fn list<'py>(&self, py: Python<'py>, all: bool, limit: u64) -> PyResult<Bound<'py, PyAny>> {
        run::awaitable(py, self.list_fut(all, limit))
    }

    /// The blocking form of `list`.
    #[pyo3(signature = (all=false, limit=1000))]
    fn list_sync(&self, py: Python<'_>, all: bool, limit: u64) -> PyResult<String> {
        run::block_all(py, self.list_fut(all, limit))
    }

    /// Deletes the tasks that ended at least `older_than` seconds ago (awaitable): how many.
    fn cleanup<'py>(&self, py: Python<'py>, older_than: run::Secs) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.cleanup_fut(older_than)?;
        run::awaitable(py, fut)
    }

    /// The blocking form of `cleanup`.
    fn cleanup_sync(&self, py: Python<'_>, older_than: run::Secs) -> PyResult<u64> {
        let fut = self.cleanup_fut(older_than)?;
        run::block_all(py, fut)
    }

    fn __repr__(&self) -> String {
        "Queue(…)".into()
    }
}

/// How the Python side says a task's coroutine ended.
enum Ended {
    Succeeded,
    Failed(String),
    Cancelled(String),
}

/// A task a worker runs, as its Python handler sees it: the task, the fence of its key's lease,
/// the lease's deadlines and the worker's stop signal.
#[pyclass(module = "leasehold._native", frozen)]
struct QueueTask {
    task: Arc<RunningTask>,
    /// The key lease's loss grace: `stop_by` is `valid_until` less it.
    loss_grace: Duration,
    /// Where the coroutine's end goes; taken by the first `_finish`.
    done: Mutex<Option<oneshot::Sender<Ended>>>,
}

#[pymethods]
impl QueueTask {
    /// The task id.
    #[getter]
    fn id(&self) -> u64 {
        self.task.task().id
    }

    /// The task's key (one running task per key).
    #[getter]
    fn key(&self) -> String {
        self.task.task().key.clone()
    }

    /// The task's group, if any.
    #[getter]
    fn group(&self) -> Option<String> {
        self.task.task().group.clone()
    }

    /// The priority it was added with: `high`, `normal` or `low`.
    #[getter]
    fn priority(&self) -> &'static str {
        self.task.task().priority.as_str()
    }

    /// Its effective priority when claimed (raised by aging).
    #[getter]
    fn effective_priority(&self) -> &'static str {
        self.task.task().effective.as_str()
    }

    /// The payload text.
    #[getter]
    fn payload(&self) -> String {
        self.task.task().payload.clone()
    }

    /// Attempts started so far, this one included.
    #[getter]
    fn attempts(&self) -> u32 {
        self.task.task().attempts
    }

    /// The task's timeout in seconds, if it has one.
    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.task.task().timeout_ms.map(|ms| ms as f64 / 1000.0)
    }

    /// The fence of the key's lease held for this run.
    #[getter]
    fn fence(&self) -> u64 {
        self.task.fence()
    }

    /// The worker's name: the holder of the key's lease.
    #[getter]
    fn worker(&self) -> String {
        self.task.worker().to_owned()
    }

    /// The task as stored when claimed, as JSON text.
    #[getter]
    fn record(&self) -> PyResult<String> {
        serde_json::to_string(self.task.task()).map_err(json_err("task"))
    }

    /// Up to when the key's lease is surely this worker's, on `time.monotonic()`'s scale; moved
    /// by each renewal.
    #[getter]
    fn valid_until(&self) -> f64 {
        run::monotonic(self.task.valid_until().into_std())
    }

    /// When the task is told to stop if the lease's renewals keep failing (`valid_until` less
    /// the loss grace), on `time.monotonic()`'s scale.
    #[getter]
    fn stop_by(&self) -> f64 {
        let v = self.task.valid_until().into_std();
        run::monotonic(v.checked_sub(self.loss_grace).unwrap_or(v))
    }

    /// By when the task must be gone once the key's lease must be given up, on
    /// `time.monotonic()`'s scale; `None` while the lease is healthy.
    #[getter]
    fn deadline(&self) -> Option<f64> {
        self.task.deadline().map(|d| run::monotonic(d.into_std()))
    }

    /// Why the task must stop, once it was told to.
    #[getter]
    fn stop_reason(&self) -> Option<String> {
        self.task.stop_reason().map(|r| r.to_string())
    }

    /// Completes with why when the task must stop (awaitable).
    fn stopped<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let task = self.task.clone();
        run::awaitable(py, async move { Ok(task.stopped().await.to_string()) })
    }

    /// Reports the coroutine's end: `kind` is `succeeded`, `failed` or `cancelled`, `detail`
    /// why. `False` when nobody waits for it any more (the run was abandoned, or ended before).
    #[pyo3(signature = (kind, detail=None))]
    fn _finish(&self, kind: &str, detail: Option<String>) -> PyResult<bool> {
        let detail = detail.unwrap_or_default();
        let ended = match kind {
            "succeeded" => Ended::Succeeded,
            "failed" => Ended::Failed(detail),
            "cancelled" => Ended::Cancelled(detail),
            _ => {
                return Err(errors::invalid_option(
                    "kind",
                    format!("{kind:?} is not an end (succeeded, failed or cancelled)"),
                ))
            }
        };
        Ok(match run::lock(&self.done).take() {
            Some(tx) => tx.send(ended).is_ok(),
            None => false,
        })
    }

    fn __repr__(&self) -> String {
        let t = self.task.task();
        format!(
            "QueueTask(id={}, key={:?}, fence={})",
            t.id,
            t.key,
            self.task.fence()
        )
    }
}

/// The Python layer's hooks of one worker (see the module docs).
struct Hooks {
    start: Py<PyAny>,
    cancel: Py<PyAny>,
    abandoned: Py<PyAny>,
    report: Py<PyAny>,
}

impl Hooks {
    /// Calls `hook` with `args`; a Python error is reported (as a problem) and given back.
    fn call<A>(&self, hook: &Py<PyAny>, args: A) -> Result<(), String>
    where
        A: for<'py> pyo3::call::PyCallArgs<'py>,
    {
        let called = Python::try_attach(|py| {
            hook.call1(py, args)
                .map(drop)
                .map_err(|e| e.value(py).to_string())
        });
        called.unwrap_or_else(|| Err("the Python interpreter is shutting down".into()))
    }

    fn report(&self, line: &str) {
        // Nowhere else to tell: the report hook itself failed.
        let _ = self.call(&self.report, (line.to_owned(),));
    }
}

/// Tells the Python side that a run was dropped before its coroutine ended, unless disarmed.
struct Abandon<'a> {
    hooks: &'a Hooks,
    task: &'a RunningTask,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            let why = self
                .task
                .stop_reason()
                .map_or_else(|| "the worker was dropped".to_owned(), |r| r.to_string());
            if let Err(e) = self
                .hooks
                .call(&self.hooks.abandoned, (self.task.task().id, why))
            {
                self.hooks.report(&format!(
                    "task {}: cannot tell the Python side its run was abandoned: {e}",
                    self.task.task().id
                ));
            }
        }
    }
}

/// The runner: each task's handler runs as a coroutine on the worker's event loop.
struct PyRunner {
    hooks: Arc<Hooks>,
    loss_grace: Duration,
}

impl PyRunner {
    async fn run_task(&self, task: RunningTask) -> Outcome {
        let task = Arc::new(task);
        let id = task.task().id;
        let (tx, mut rx) = oneshot::channel();
        let made = Python::try_attach(|py| {
            Py::new(
                py,
                QueueTask {
                    task: task.clone(),
                    loss_grace: self.loss_grace,
                    done: Mutex::new(Some(tx)),
                },
            )
            .map_err(|e| e.value(py).to_string())
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".into()));
        let started = made.and_then(|obj| self.hooks.call(&self.hooks.start, (obj,)));
        if let Err(e) = started {
            let why = format!("cannot start the task's coroutine: {e}");
            self.hooks.report(&format!("task {id}: {why}"));
            return Outcome::Failed(why);
        }
        let mut abandon = Abandon {
            hooks: &self.hooks,
            task: &task,
            armed: true,
        };
        let mut told: Option<TaskStop> = None;
        let ended = loop {
            tokio::select! {
                biased;
                ended = &mut rx => break ended,
                why = task.stopped(), if told.is_none() => {
                    if let Err(e) = self.hooks.call(&self.hooks.cancel, (id, why.to_string())) {
                        self.hooks.report(&format!("task {id}: cannot cancel its coroutine: {e}"));
                    }
                    told = Some(why);
                }
            }
        };
        abandon.armed = false;
        // Told to stop, the task ends as the stop says (as `leasehold queue work` records it).
        let told = told.or_else(|| task.stop_reason());
        match (told, ended) {
            (Some(why), _) => why.outcome(),
            (None, Ok(Ended::Succeeded)) => Outcome::Succeeded,
            (None, Ok(Ended::Failed(why))) => Outcome::Failed(why),
            (None, Ok(Ended::Cancelled(why))) => Outcome::Cancelled(why),
            (None, Err(_)) => {
                Outcome::Failed("the task's coroutine ended without reporting its end".into())
            }
        }
    }
}

impl TaskRunner for PyRunner {
    fn run(&self, task: RunningTask) -> impl Future<Output = Outcome> + Send {
        self.run_task(task)
    }
}

/// A queue worker whose tasks run as coroutines on the event loop that awaits `run`.
#[pyclass(module = "leasehold._native", frozen)]
struct Worker {
    name: String,
    shutdown: Shutdown,
    /// The library's worker and its runner until `run` takes them.
    ready: Mutex<Option<(leasehold::queue::worker::Worker, PyRunner)>>,
}

/// A worker's options: the library's `WorkerOptions`, filled once from keywords (seconds as
/// `int` or `float`, counts as `int`; `None` keeps the library's default).
#[pyclass(module = "leasehold._native", frozen)]
struct WorkerOptions {
    inner: leasehold::queue::worker::WorkerOptions,
}

#[pymethods]
impl WorkerOptions {
    #[new]
    #[pyo3(signature = (*, slots=None, ttl=None, group_limit=None, lease_wait=None, aging=None, drain_timeout=None, stop_grace=None, cleanup_after=None, exit_when_idle=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        slots: Option<i64>,
        ttl: Option<run::Secs>,
        group_limit: Option<i64>,
        lease_wait: Option<run::Secs>,
        aging: Option<run::Secs>,
        drain_timeout: Option<run::Secs>,
        stop_grace: Option<run::Secs>,
        cleanup_after: Option<run::Secs>,
        exit_when_idle: bool,
    ) -> PyResult<Self> {
        let mut o = leasehold::queue::worker::WorkerOptions::default();
        if let Some(n) = slots {
            o.slots = count("slots", n)?;
        }
        if let Some(ttl) = run::seconds("ttl", ttl)? {
            o.ttl = ttl;
        }
        o.group_limit = group_limit.map(|n| count("group_limit", n)).transpose()?;
        o.lease_wait = run::seconds("lease_wait", lease_wait)?;
        if let Some(aging) = run::seconds("aging", aging)? {
            o.aging = aging;
        }
        if let Some(d) = run::seconds("drain_timeout", drain_timeout)? {
            o.drain_timeout = d;
        }
        if let Some(g) = run::seconds("stop_grace", stop_grace)? {
            o.stop_grace = g;
        }
        o.cleanup_after = run::seconds("cleanup_after", cleanup_after)?;
        o.exit_when_idle = exit_when_idle;
        // Refused here, as a lock's options are, rather than when the worker runs.
        o.validate().py()?;
        Ok(WorkerOptions { inner: o })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

#[pymethods]
impl Worker {
    /// A worker on `queue` with `options`, taking the key leases from `locks` (under the holder
    /// `name` if given), calling the hooks `start`, `cancel`, `abandoned` and `report` (see the
    /// module docs of `leasehold.queue`).
    #[new]
    #[pyo3(signature = (queue, locks, start, cancel, abandoned, report, options, *, name=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        queue: &Queue,
        locks: &crate::locks::Locks,
        start: Py<PyAny>,
        cancel: Py<PyAny>,
        abandoned: Py<PyAny>,
        report: Py<PyAny>,
        options: &WorkerOptions,
        name: Option<String>,
    ) -> PyResult<Self> {
        let locks = match name {
            Some(n) if n.trim().is_empty() => {
                return Err(errors::invalid_option("name", "must not be empty".into()))
            }
            Some(n) => locks.inner.clone().with_holder(HolderId::new(n)),
            None => locks.inner.clone(),
        };
        let hooks = Arc::new(Hooks {
            start,
            cancel,
            abandoned,
            report,
        });
        let reporter = hooks.clone();
        let w = leasehold::queue::worker::Worker::new(queue.inner.clone(), locks)
            .options(options.inner.clone())
            .on_problem(move |line| reporter.report(line));
        // The key leases are taken with the worker's TTL and the other options at their
        // defaults: their loss grace is the default rule's.
        let mut lease = LockOptions::default();
        lease.ttl = options.inner.ttl;
        // Refused here, as a lock's options are, rather than at each claim.
        lease.validate().py()?;
        let runner = PyRunner {
            hooks,
            loss_grace: lease.loss_grace_period(),
        };
        Ok(Worker {
            name: w.name().to_owned(),
            shutdown: w.shutdown_handle(),
            ready: Mutex::new(Some((w, runner))),
        })
    }

    /// The worker's name in the queue (the holder of its key leases).
    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }

    /// Runs the worker until it is drained or stopped (or, with `exit_when_idle`, the queue is
    /// idle), then deregisters it (awaitable). A worker runs once.
    fn run<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some((worker, runner)) = run::lock(&self.ready).take() else {
            return Err(errors::invalid_option(
                "worker",
                "this worker has run already".into(),
            ));
        };
        run::awaitable(py, async move { worker.run(runner).await.py() })
    }

    /// No more claims; running tasks may finish for up to the drain timeout, then are told to
    /// stop.
    fn drain(&self) {
        self.shutdown.drain();
    }

    /// Drains, and tells the running tasks to stop now.
    fn stop(&self) {
        self.shutdown.stop();
    }

    /// Whether `drain` or `stop` was called.
    #[getter]
    fn is_stopping(&self) -> bool {
        self.shutdown.is_requested()
    }

    fn __repr__(&self) -> String {
        format!("Worker(name={:?})", self.name)
    }
}

/// Adds the queue's classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open_queue, m)?)?;
    m.add_class::<Queue>()?;
    m.add_class::<QueueTask>()?;
    m.add_class::<Worker>()?;
    m.add_class::<WorkerOptions>()?;
    m.add_class::<NewTask>()?;
    m.add_function(wrap_pyfunction!(default_queue_url, m)?)?;
    m.add_function(wrap_pyfunction!(worker_store_url, m)?)?;
    Ok(())
}
