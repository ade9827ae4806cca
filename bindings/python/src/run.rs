//! Running the library's futures for Python: on one tokio runtime per process, awaited from
//! asyncio or waited for with the GIL released.
//!
//! The asyncio bridge is this crate's own rather than pyo3-async-runtimes': that one moves every
//! call through four threads (two spawns, a blocking-pool thread to take the GIL, the loop's
//! thread), 75 µs a call on the machines measured; this one polls on the caller's thread first
//! and answers a pending call through an eventfd the loop watches, one hop each way.

use crate::errors;
use leasehold::runtime::RuntimeError;
use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::{intern, IntoPyObjectExt};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often a blocking call wakes up to let Python handle a signal (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The Python exception for a runtime that cannot be had.
fn runtime_error(e: RuntimeError) -> PyErr {
    match e {
        RuntimeError::Forked { .. } => errors::forked(&e),
        other => errors::internal(&other.to_string()),
    }
}

/// Refuses a call in a child forked after the runtime started.
pub(crate) fn check_fork() -> PyResult<()> {
    leasehold::runtime::check_fork().map_err(runtime_error)
}

/// The process's runtime ([`leasehold::runtime::shared`], the one the C ABI uses too).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    leasehold::runtime::shared().map_err(runtime_error)
}

/// `fut` as an asyncio awaitable.
///
/// The bridge is this crate's own, lean one: `fut` is first polled here, on the calling thread
/// (a lease the local layer hands over, a memory or file store call, is then answered with no
/// thread hop at all); only when it is pending does it move to the runtime, whose task queues its
/// answer for the loop's [`LoopWaker`]. Cancelling that future drops `fut` (as dropping a Rust
/// future does: an acquisition in progress is undone in the background).
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    awaitable_as(py, fut, OnCancelled::Drop)
}

/// What cancelling an awaitable's asyncio future does to its Rust future.
pub(crate) enum OnCancelled {
    /// Drops it ([`awaitable`]).
    Drop,
    /// Nothing: it runs to its end, its answer unread (a release).
    Finish,
    /// Nothing: it runs to its end (the caller stops it its own way) and its answer is passed
    /// to this callable (`None` for an error) instead of the cancelled future.
    Hand(Py<PyAny>),
}

/// [`awaitable`], with what cancelling it does.
pub(crate) fn awaitable_as<'py, F, T>(
    py: Python<'py>,
    fut: F,
    on_cancelled: OnCancelled,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let rt = runtime()?;
    let mut fut = Box::pin(fut);
    let event_loop = running_loop(py)?;
    let waker = loop_waker(&event_loop)?;
    // With nothing else in flight on this loop, the call starts here: it may be answered at once
    // (no thread hop), and the request leaves sooner. With calls in flight, the loop's thread is
    // the busy one: the call starts on the runtime's threads instead.
    if waker.get().in_flight.load(Ordering::Relaxed) == 0 {
        // The GIL is released while the store call runs, here as on the runtime's threads.
        let polled = py.detach(|| {
            let _in_runtime = rt.enter();
            let mut cx = Context::from_waker(Waker::noop());
            fut.as_mut().poll(&mut cx)
        });
        if let Poll::Ready(result) = polled {
            let value = result.and_then(|v| v.into_py_any(py))?;
            return ready(py, value);
        }
    }
    let py_fut = event_loop.call_method0(intern!(py, "create_future"))?;
    let (cancel_tx, cancel_rx) = tokio::sync::oneshot::channel::<()>();
    let hand = match on_cancelled {
        OnCancelled::Drop => {
            py_fut.call_method1(
                intern!(py, "add_done_callback"),
                (OnCancel {
                    tx: Slot::new(cancel_tx),
                },),
            )?;
            None
        }
        OnCancelled::Finish => {
            drop(cancel_tx); // never cancelled: the branch below is disabled
            None
        }
        OnCancelled::Hand(to) => {
            drop(cancel_tx);
            Some(to)
        }
    };
    let target = py_fut.clone().unbind();
    waker.get().in_flight.fetch_add(1, Ordering::Relaxed);
    let waker = std::sync::Arc::new(waker);
    rt.spawn(async move {
        let counted = InFlight(waker.clone());
        let result = tokio::select! {
            biased;
            Ok(()) = cancel_rx => return,
            r = fut => r,
        };
        drop(counted); // answered: before the loop can see the answer and call again
        waker.get().push(
            target,
            Box::new(move |py| result.and_then(|v| v.into_py_any(py))),
            hand,
        );
    });
    Ok(py_fut)
}

static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `asyncio.get_running_loop()`: the caller's event loop (a `RuntimeError` outside one).
pub(crate) fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    GET_RUNNING_LOOP
        .get_or_try_init(py, || {
            py.import("asyncio")?
                .getattr("get_running_loop")
                .map(Bound::unbind)
        })?
        .bind(py)
        .call0()
}

/// `m` locked; a lock poisoned by a panic elsewhere is taken as it is (the values these locks
/// guard stay valid at every step).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes a Python value of a result, on the loop's thread.
type MakeValue = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// An answer for a future: the future, its value, and whom to hand it to if it was cancelled.
type Answer = (Py<PyAny>, MakeValue, Option<Py<PyAny>>);

/// The answers for one asyncio event loop: the runtime's tasks queue them and write to an
/// eventfd the loop watches (`loop.add_reader`); the loop's thread then sets each future's
/// result. No runtime thread ever waits for the GIL, and one wake-up of the loop's thread serves
/// every answer queued by then.
#[pyclass(module = "leasehold._native", frozen)]
struct LoopWaker {
    fd: libc::c_int,
    /// Calls started and not answered yet.
    in_flight: AtomicUsize,
    queue: std::sync::Mutex<Vec<Answer>>,
}

/// Counts a call in flight on its loop until dropped (when its task ends, answered or not).
struct InFlight(std::sync::Arc<Py<LoopWaker>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.get().in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for LoopWaker {
    fn drop(&mut self) {
        // SAFETY: the eventfd is this value's own and closed only here.
        unsafe { libc::close(self.fd) };
    }
}

impl LoopWaker {
    fn push(&self, fut: Py<PyAny>, make: MakeValue, hand: Option<Py<PyAny>>) {
        let mut queue = lock(&self.queue);
        let was_empty = queue.is_empty();
        queue.push((fut, make, hand));
        drop(queue);
        if was_empty {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to the eventfd; a full counter (never, at
            // one write per batch) would only fail the write, and the loop drains anyway.
            unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
        }
    }
}

#[pymethods]
impl LoopWaker {
    /// The loop's reader callback: sets the results queued since the last call.
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from the non-blocking eventfd.
        unsafe { libc::read(self.fd, (&mut count as *mut u64).cast(), 8) };
        let items = std::mem::take(&mut *lock(&self.queue));
        for (fut, make, hand) in items {
            let fut = fut.bind(py);
            let value = make(py);
            if fut.call_method0(intern!(py, "done"))?.is_truthy()? {
                // Cancelled meanwhile.
                if let Some(to) = hand {
                    to.bind(py).call1((value.unwrap_or_else(|_| py.None()),))?;
                }
                continue;
            }
            match value {
                Ok(v) => fut.call_method1(intern!(py, "set_result"), (v,))?,
                Err(e) => fut.call_method1(intern!(py, "set_exception"), (e.into_value(py),))?,
            };
        }
        Ok(())
    }
}

/// The [`LoopWaker`] of `event_loop`, made and registered on its first use (kept as an attribute
/// of the loop, so that it lives and dies with it).
fn loop_waker(event_loop: &Bound<'_, PyAny>) -> PyResult<Py<LoopWaker>> {
    let py = event_loop.py();
    let name = intern!(py, "_leasehold_waker");
    if let Ok(found) = event_loop.getattr(name) {
        if let Ok(w) = found.cast_into::<LoopWaker>() {
            return Ok(w.unbind());
        }
    }
    // SAFETY: eventfd has no memory arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(errors::internal(&format!(
            "eventfd: {}",
            std::io::Error::last_os_error()
        )));
    }
    let waker = Py::new(
        py,
        LoopWaker {
            fd,
            in_flight: AtomicUsize::new(0),
            queue: std::sync::Mutex::new(Vec::new()),
        },
    )?;
    let drain = waker.bind(py).getattr(intern!(py, "drain"))?;
    event_loop.call_method1(intern!(py, "add_reader"), (fd, drain))?;
    event_loop.setattr(name, &waker)?;
    Ok(waker)
}

/// The done callback of an awaitable's asyncio future: a cancelled future drops its Rust future.
#[pyclass(module = "leasehold._native", frozen)]
struct OnCancel {
    tx: Slot<tokio::sync::oneshot::Sender<()>>,
}

#[pymethods]
impl OnCancel {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut
            .call_method0(intern!(fut.py(), "cancelled"))?
            .is_truthy()?
        {
            if let Some(tx) = self.tx.take() {
                let _ = tx.send(());
            }
        }
        Ok(())
    }
}

/// A value taken at most once, from any thread.
struct Slot<T>(std::sync::Mutex<Option<T>>);

impl<T> Slot<T> {
    fn new(v: T) -> Self {
        Slot(std::sync::Mutex::new(Some(v)))
    }

    fn take(&self) -> Option<T> {
        lock(&self.0).take()
    }
}

/// An awaitable of `value`, there already.
pub(crate) fn ready(py: Python<'_>, value: Py<PyAny>) -> PyResult<Bound<'_, PyAny>> {
    Bound::new(py, Ready { value: Some(value) }).map(Bound::into_any)
}

/// An awaitable whose value is there already: `await` gives it without suspending.
#[pyclass(module = "leasehold._native")]
pub(crate) struct Ready {
    value: Option<Py<PyAny>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let value = self.value.take().unwrap_or_else(|| py.None());
        Err(PyStopIteration::new_err((value,)))
    }
}

/// Runs `fut` to its end with the GIL released, on the calling thread (the runtime's threads
/// drive its I/O). Every [`SIGNAL_CHECK`] it lets Python run its signal handlers: a
/// `KeyboardInterrupt` drops `fut` (undoing what it started) and is raised. With `limit`, gives
/// `None` when `fut` has not finished by then (and drops it).
pub(crate) fn block<F, T>(py: Python<'_>, limit: Option<Duration>, fut: F) -> PyResult<Option<T>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: Send + 'static,
{
    let rt = runtime()?;
    if tokio::runtime::Handle::try_current().is_ok() {
        // A runtime thread (a handler called from one) cannot block on the runtime.
        return block_elsewhere(py, rt, limit, fut);
    }
    let mut fut = Box::pin(fut);
    let deadline = limit.map(|l| Instant::now() + l);
    loop {
        let step = next_step(deadline);
        let answer =
            py.detach(|| rt.block_on(async { tokio::time::timeout(step, fut.as_mut()).await }));
        match answer {
            Ok(result) => return result.map(Some),
            Err(_) => {
                py.check_signals()?;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(None);
                }
            }
        }
    }
}

/// How long a blocking call waits before its next signal check: [`SIGNAL_CHECK`], or less to end
/// at `deadline`.
fn next_step(deadline: Option<Instant>) -> Duration {
    deadline.map_or(SIGNAL_CHECK, |d| {
        d.saturating_duration_since(Instant::now())
            .min(SIGNAL_CHECK)
    })
}

/// [`block`] for a caller on a runtime thread: `fut` runs as a task of its own.
fn block_elsewhere<F, T>(
    py: Python<'_>,
    rt: &'static tokio::runtime::Runtime,
    limit: Option<Duration>,
    fut: F,
) -> PyResult<Option<T>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let task = rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let deadline = limit.map(|l| Instant::now() + l);
    let mut rx = rx;
    loop {
        let step = next_step(deadline);
        let (back, answer) = py.detach(move || {
            let answer = rx.recv_timeout(step);
            (rx, answer)
        });
        rx = back;
        match answer {
            Ok(result) => return result.map(Some),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(errors::internal("the call's task ended without an answer"));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    task.abort();
                    return Err(e);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    task.abort();
                    return Ok(None);
                }
            }
        }
    }
}

/// [`block`] without a limit.
pub(crate) fn block_all<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: Send + 'static,
{
    match block(py, None, fut)? {
        Some(v) => Ok(v),
        None => Err(errors::internal("a call without a limit stopped early")),
    }
}

/// `instant` on Python's `time.monotonic()` scale (both read `CLOCK_MONOTONIC` on Linux).
pub(crate) fn monotonic(instant: Instant) -> f64 {
    leasehold::runtime::monotonic_ns(instant) as f64 / 1e9
}

/// Seconds as Python passes them: an `int` or a `float`, never a `bool` (`ttl=True` is a
/// mistake, not one second: it is refused with a `TypeError`, as any other non-number is).
#[derive(Clone, Copy)]
pub(crate) struct Secs(pub(crate) f64);

impl<'a, 'py> FromPyObject<'a, 'py> for Secs {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<pyo3::types::PyBool>() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "a bool is not a number of seconds",
            ));
        }
        Ok(Secs(obj.extract::<f64>()?))
    }
}

/// Seconds from Python, refused when negative or not finite.
pub(crate) fn seconds(name: &'static str, value: Option<Secs>) -> PyResult<Option<Duration>> {
    match value.map(|s| s.0) {
        None => Ok(None),
        Some(v) if v >= 0.0 => match Duration::try_from_secs_f64(v) {
            Ok(d) => Ok(Some(d)),
            // Past `Duration::MAX` (or infinite): refused, as `from_secs_f64` would panic.
            Err(_) => Err(errors::invalid_option(
                name,
                format!("{v:.3e} seconds is too long"),
            )),
        },
        Some(v) => Err(errors::invalid_option(
            name,
            format!("{v} is not a number of seconds ≥ 0"),
        )),
    }
}
