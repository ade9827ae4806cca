//! Running the library's futures for Python: on one tokio runtime per process (the one
//! pyo3-async-runtimes keeps), awaited from asyncio or waited for with the GIL released.

use crate::errors;
use pyo3::prelude::*;
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The process that started the runtime. A child forked after that has the runtime's memory but
/// none of its threads: a call there would wait forever, so it is refused instead.
static STARTED_IN: OnceLock<u32> = OnceLock::new();

/// How often a blocking call wakes up to let Python handle a signal (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Refuses a call in a child forked after the runtime started.
pub(crate) fn check_fork() -> PyResult<()> {
    let me = std::process::id();
    let started = *STARTED_IN.get_or_init(|| me);
    if started == me {
        Ok(())
    } else {
        Err(errors::forked(started, me))
    }
}

fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    check_fork()?;
    Ok(pyo3_async_runtimes::tokio::get_runtime())
}

/// `fut` as an asyncio awaitable. Cancelling the awaitable drops `fut` (as dropping a Rust future
/// does: an acquisition in progress is undone).
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    runtime()?;
    pyo3_async_runtimes::tokio::future_into_py(py, fut)
}

/// Runs `fut` to its end with the GIL released. Every [`SIGNAL_CHECK`] it lets Python run its
/// signal handlers: a `KeyboardInterrupt` drops `fut` (undoing what it started) and is raised.
/// With `limit`, gives `None` when `fut` has not finished by then (and drops it).
pub(crate) fn block<F, T>(py: Python<'_>, limit: Option<Duration>, fut: F) -> PyResult<Option<T>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: Send + 'static,
{
    let rt = runtime()?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let task = rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let deadline = limit.map(|l| Instant::now() + l);
    let mut rx = rx;
    loop {
        let step = match deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(SIGNAL_CHECK),
            None => SIGNAL_CHECK,
        };
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
    let now = Instant::now();
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let now_s = ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9;
    if instant >= now {
        now_s + (instant - now).as_secs_f64()
    } else {
        now_s - (now - instant).as_secs_f64()
    }
}

/// Seconds from Python (`float`), refused when negative or not finite.
pub(crate) fn seconds(name: &'static str, value: Option<f64>) -> PyResult<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(Some(Duration::from_secs_f64(v))),
        Some(v) => Err(errors::from_error(leasehold::Error::InvalidOption {
            name,
            reason: format!("{v} is not a number of seconds ≥ 0"),
        })),
    }
}
