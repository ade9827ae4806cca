//! A held lease: the library's `LeaseGuard` for Python.

use crate::errors::IntoPy;
use crate::run;
use leasehold::{LeaseGuard, Released};
use pyo3::prelude::*;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a cancelled acquisition waits for the library to undo what it started (withdraw a
/// waiter registration, release a grant that was in flight).
const UNDO_LIMIT: Duration = Duration::from_secs(5);

/// The cancellation of one acquisition awaited from asyncio. The Python layer shields the
/// acquisition's awaitable and, when its task is cancelled, calls `cancel()` and awaits the
/// acquisition's end: it ends once what it started is undone (so `asyncio.wait_for` returns with
/// no waiter registration and no grant left behind), or with the lease when it was granted first
/// (then the Python layer releases it).
#[pyclass(module = "leasehold._native", frozen)]
pub(crate) struct Cancel {
    tx: watch::Sender<bool>,
    late: std::sync::Mutex<Late>,
}

/// The answer of an acquisition whose awaitable was cancelled.
enum Late {
    /// Not there yet, and nobody asked.
    Waiting,
    /// There: the lease granted before the cancel took effect, or `None`.
    Value(Py<PyAny>),
    /// Asked for: the asyncio future to complete with it.
    Asked(Py<PyAny>),
}

#[pymethods]
impl Cancel {
    #[new]
    fn new() -> Self {
        Cancel {
            tx: watch::channel(false).0,
            late: std::sync::Mutex::new(Late::Waiting),
        }
    }

    /// Stops the acquisition this handle was given to.
    fn cancel(&self) {
        self.tx.send_replace(true);
    }

    /// Awaitable: the acquisition's answer once it has ended after `cancel()`: the lease granted
    /// before the cancel took effect (release it), or `None` with everything undone.
    fn late<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut late = run::lock(&self.late);
        match std::mem::replace(&mut *late, Late::Waiting) {
            Late::Value(v) => run::ready(py, v),
            Late::Waiting | Late::Asked(_) => {
                let fut = run::running_loop(py)?.call_method0("create_future")?;
                *late = Late::Asked(fut.clone().unbind());
                Ok(fut)
            }
        }
    }

    /// Called on the loop's thread with the answer of the cancelled awaitable.
    fn stash(&self, py: Python<'_>, value: Py<PyAny>) -> PyResult<()> {
        let mut late = run::lock(&self.late);
        match std::mem::replace(&mut *late, Late::Waiting) {
            Late::Asked(fut) => {
                drop(late);
                let fut = fut.bind(py);
                if !fut.call_method0("done")?.is_truthy()? {
                    fut.call_method1("set_result", (value,))?;
                }
            }
            Late::Waiting | Late::Value(_) => *late = Late::Value(value),
        }
        Ok(())
    }
}

impl Cancel {
    /// `acquisition` as an awaitable that `cancel` stops: its answer, when it comes after the
    /// awaitable was cancelled, goes to `cancel` (see [`Cancel::late`]).
    pub(crate) fn awaitable<'py, F>(
        py: Python<'py>,
        cancel: &Bound<'_, Self>,
        acquisition: F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = PyResult<Option<LeaseGuard>>> + Send + 'static,
    {
        let hand = cancel.getattr("stash")?.unbind();
        run::awaitable_as(
            py,
            cancel.get().guard(acquisition),
            run::OnCancelled::Hand(hand),
        )
    }

    /// `acquisition`, stopped by [`Cancel::cancel`]: `None` then, once the library's background
    /// work for it has settled.
    fn guard<F>(
        &self,
        acquisition: F,
    ) -> impl Future<Output = PyResult<Option<Lease>>> + Send + 'static
    where
        F: Future<Output = PyResult<Option<LeaseGuard>>> + Send + 'static,
    {
        let mut rx = self.tx.subscribe();
        async move {
            tokio::select! {
                biased;
                () = async {
                    if rx.wait_for(|c| *c).await.is_err() {
                        // The handle is gone without a cancel: nothing can cancel any more.
                        std::future::pending::<()>().await;
                    }
                } => {
                    leasehold::settle(UNDO_LIMIT).await;
                    Ok(None)
                }
                got = acquisition => Ok(got?.map(Lease::new)),
            }
        }
    }
}

/// A lease this process holds, renewed in the background until released. Dropping it without
/// `release` releases it in the background (from any thread: the guard releases on the runtime
/// it was granted under).
#[pyclass(module = "leasehold._native", frozen)]
pub(crate) struct Lease {
    guard: Arc<LeaseGuard>,
    /// Dropped with the lease: the watchers of the Python layer (`lost`, `handoff_requested`)
    /// then end with `None`, so that they never keep a lease nobody holds any more alive (and
    /// renewed).
    gone: watch::Sender<()>,
}

impl Lease {
    pub(crate) fn new(guard: LeaseGuard) -> Self {
        Lease {
            guard: Arc::new(guard),
            gone: watch::channel(()).0,
        }
    }

    /// The guard, refused in a child forked after the runtime started: there, the parent's
    /// lease must not be taken for this process's (it is not renewed here, and whether it is
    /// still current is the parent's to know).
    fn guard(&self) -> PyResult<&LeaseGuard> {
        run::check_fork()?;
        Ok(&self.guard)
    }

    /// `wait` on the guard, ending with `None` once this lease is dropped.
    fn watch<F, Fut>(
        &self,
        wait: F,
    ) -> impl Future<Output = PyResult<Option<String>>> + Send + 'static
    where
        F: FnOnce(Arc<LeaseGuard>) -> Fut + Send + 'static,
        Fut: Future<Output = String> + Send + 'static,
    {
        let g = self.guard.clone();
        let mut gone = self.gone.subscribe();
        async move {
            tokio::select! {
                detail = wait(g) => Ok(Some(detail)),
                // Only ever an error: the sender went with the lease.
                _ = gone.changed() => Ok(None),
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if leasehold::runtime::is_forked() {
            // A forked child's copy of the parent's lease: releasing it would free the parent's
            // key while the parent works under it. It is left alone (leaked, with its runtime).
            std::mem::forget(self.guard.clone());
        }
    }
}

/// A release's answer as text: `released`, `already released`, or `lost: <reason>`.
fn released(r: Released) -> String {
    match r {
        Released::Released => "released".into(),
        Released::AlreadyReleased => "already released".into(),
        Released::Lost(reason) => format!("lost: {reason}"),
    }
}

#[pymethods]
impl Lease {
    /// The key.
    #[getter]
    fn key(&self) -> String {
        self.guard.key().to_string()
    }

    /// The fencing token: strictly greater than every earlier lease's on this key.
    #[getter]
    fn fence(&self) -> PyResult<u64> {
        Ok(self.guard()?.fence())
    }

    /// The holder identity the lease was taken with.
    #[getter]
    fn holder(&self) -> String {
        self.guard.record().holder.clone().unwrap_or_default()
    }

    /// This acquisition's token (tells this lease from a later one of the same holder).
    #[getter]
    fn token(&self) -> String {
        self.guard.token().to_string()
    }

    /// The lease is surely valid until then and not after, on `time.monotonic()`'s scale.
    #[getter]
    fn valid_until(&self) -> PyResult<f64> {
        Ok(run::monotonic(self.guard()?.valid_until().into_std()))
    }

    /// When work under the lease should stop if renewals keep failing (`valid_until` less the
    /// loss grace), on `time.monotonic()`'s scale.
    #[getter]
    fn stop_by(&self) -> PyResult<f64> {
        Ok(run::monotonic(self.guard()?.stop_by().into_std()))
    }

    /// Whether the lease is still held (not lost, not released).
    #[getter]
    fn is_current(&self) -> PyResult<bool> {
        Ok(self.guard()?.is_current())
    }

    /// Whether a waiter has asked for the lease.
    #[getter]
    fn is_handoff_requested(&self) -> PyResult<bool> {
        Ok(self.guard()?.is_handoff_requested())
    }

    /// The record as JSON text, as it was when the lease was taken.
    #[getter]
    fn record(&self) -> PyResult<String> {
        crate::locks::to_json(self.guard.record())
    }

    /// Completes with why the lease was lost (awaitable); with `None` if this lease is dropped
    /// first (only a watcher that does not hold it sees that).
    fn lost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run::awaitable(
            py,
            self.watch(|g| async move { g.lost().await.to_string() }),
        )
    }

    /// Waits up to `timeout` seconds (no limit with `None`) for the lease to be lost: why, or
    /// `None` when it was not lost by then.
    #[pyo3(signature = (timeout=None))]
    fn lost_sync(&self, py: Python<'_>, timeout: Option<run::Secs>) -> PyResult<Option<String>> {
        let limit = run::seconds("timeout", timeout)?;
        let g = self.guard.clone();
        run::block(py, limit, async move { Ok(g.lost().await.to_string()) })
    }

    /// Completes with the waiter's identity when someone waits for the lease (awaitable); with
    /// `None` if this lease is dropped first.
    fn handoff_requested<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        run::awaitable(
            py,
            self.watch(|g| async move { g.handoff_requested().await }),
        )
    }

    /// Waits up to `timeout` seconds for a waiter: its identity, or `None`.
    #[pyo3(signature = (timeout=None))]
    fn handoff_requested_sync(
        &self,
        py: Python<'_>,
        timeout: Option<run::Secs>,
    ) -> PyResult<Option<String>> {
        let limit = run::seconds("timeout", timeout)?;
        let g = self.guard.clone();
        run::block(py, limit, async move { Ok(g.handoff_requested().await) })
    }

    /// Completes when work under the lease must stop: renewals failing into the loss grace, or
    /// the lease lost (awaitable); gives why.
    fn must_stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let g = self.guard.clone();
        run::awaitable(py, async move { Ok(g.must_stop().await.to_string()) })
    }

    /// Releases the lease (awaitable; idempotent): `released`, `already released`, or
    /// `lost: <reason>`.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let g = self.guard.clone();
        run::awaitable_as(
            py,
            async move { g.release().await.py().map(released) },
            run::OnCancelled::Finish,
        )
    }

    /// The blocking form of `release`.
    fn release_sync(&self, py: Python<'_>) -> PyResult<String> {
        let g = self.guard.clone();
        run::block_all(py, async move { g.release().await.py().map(released) })
    }

    fn __repr__(&self) -> String {
        match self.guard() {
            Ok(g) => format!(
                "Lease(key={:?}, fence={}, holder={:?}, current={})",
                self.key(),
                g.fence(),
                self.holder(),
                g.is_current()
            ),
            Err(_) => format!(
                "Lease(key={:?}, holder={:?}, the parent's: this process is a fork)",
                self.key(),
                self.holder()
            ),
        }
    }
}

/// Adds the lease's classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Lease>()?;
    m.add_class::<Cancel>()?;
    Ok(())
}
