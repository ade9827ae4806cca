//! `leasehold._native`: the Rust core of the `leasehold` Python package. The package's Python
//! layer (`python/leasehold/`) builds the user API (context managers, handlers) over it; its
//! stubs are `python/leasehold/_native.pyi`.

// The asyncio bridge answers through an eventfd (`run.rs`): Linux only.
#[cfg(not(target_os = "linux"))]
compile_error!("the leasehold Python package runs on Linux only (its asyncio bridge uses eventfd)");

mod errors;
mod lease;
mod queue;
mod run;

use errors::IntoPy;
use lease::{Cancel, Lease};
use leasehold::{HolderId, Inspection, LockBuilder, Wait};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// Opens the store at `url` (any URL the `leasehold` command takes) as one client. Blocks with
/// the GIL released while the store is opened.
#[pyfunction]
#[pyo3(signature = (url, *, holder=None, local_layer=true))]
fn connect(
    py: Python<'_>,
    url: String,
    holder: Option<String>,
    local_layer: bool,
) -> PyResult<Locks> {
    run::block_all(py, open(url, holder, local_layer))
}

/// `connect`, awaitable: the store is opened on the library's threads, so the event loop goes on
/// meanwhile (a connection, credentials read from the environment or a metadata server).
#[pyfunction]
#[pyo3(signature = (url, *, holder=None, local_layer=true))]
fn connect_async(
    py: Python<'_>,
    url: String,
    holder: Option<String>,
    local_layer: bool,
) -> PyResult<Bound<'_, PyAny>> {
    run::awaitable(py, async move {
        // Not polled on the loop's thread at all: opening a store may do blocking work before
        // its first await.
        tokio::spawn(open(url, holder, local_layer))
            .await
            .map_err(|e| errors::internal(&format!("connect: {e}")))?
    })
}

/// Opens the store at `url` as one client.
async fn open(url: String, holder: Option<String>, local_layer: bool) -> PyResult<Locks> {
    let locks = leasehold::connect(&url).await.py()?;
    let locks = match holder {
        Some(h) => locks.with_holder(HolderId::new(h)),
        None => locks,
    };
    Ok(Locks {
        inner: locks.with_local_layer(local_layer),
    })
}

/// Waits up to `timeout` seconds for the library's background work (releases of dropped leases,
/// withdrawals of abandoned waits) to finish; gives how many tasks were left.
#[pyfunction]
#[pyo3(signature = (timeout=run::Secs(2.0)), text_signature = "(timeout=2.0)")]
fn settle(py: Python<'_>, timeout: run::Secs) -> PyResult<usize> {
    let limit = run::seconds("timeout", Some(timeout))?.unwrap_or_default();
    run::block_all(py, async move { Ok(leasehold::settle(limit).await) })
}

/// One client of one store, with one holder identity.
#[pyclass(module = "leasehold._native", frozen)]
struct Locks {
    inner: leasehold::Locks,
}

/// The options of one acquisition, as Python passes them.
struct Options {
    ttl: Option<Duration>,
    wait: Option<Duration>,
    renew_every: Option<Duration>,
    waiter_ttl: Option<Duration>,
    register_waiter: bool,
    labels: BTreeMap<String, String>,
}

impl Options {
    #[allow(clippy::too_many_arguments)]
    fn new(
        ttl: Option<run::Secs>,
        wait: Option<run::Secs>,
        renew_every: Option<run::Secs>,
        waiter_ttl: Option<run::Secs>,
        register_waiter: bool,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Self> {
        Ok(Options {
            ttl: run::seconds("ttl", ttl)?,
            wait: run::seconds("wait", wait)?,
            renew_every: run::seconds("renew_every", renew_every)?,
            waiter_ttl: run::seconds("waiter_ttl", waiter_ttl)?,
            register_waiter,
            labels: labels.unwrap_or_default(),
        })
    }

    fn apply(self, mut b: LockBuilder) -> LockBuilder {
        if let Some(ttl) = self.ttl {
            b = b.ttl(ttl);
        }
        b = match self.wait {
            None => b.wait_policy(Wait::Forever),
            Some(d) if d.is_zero() => b.wait_policy(Wait::No),
            Some(d) => b.wait(d),
        };
        if let Some(p) = self.renew_every {
            b = b.renew_every(p);
        }
        if let Some(w) = self.waiter_ttl {
            b = b.waiter_ttl(w);
        }
        b = b.register_waiter(self.register_waiter);
        for (k, v) in self.labels {
            b = b.label(k, v);
        }
        b
    }
}

/// A record as JSON text.
fn to_json(r: &leasehold::LeaseRecord) -> PyResult<String> {
    serde_json::to_string(r).map_err(|e| errors::internal(&format!("record to JSON: {e}")))
}

impl Locks {
    fn force_release_json(
        &self,
        key: &str,
    ) -> PyResult<impl std::future::Future<Output = PyResult<Option<String>>> + Send + 'static>
    {
        let key = leasehold::Key::new(key).py()?;
        let store = self.inner.store().clone();
        Ok(async move {
            store
                .force_release(&key)
                .await
                .py()?
                .as_ref()
                .map(to_json)
                .transpose()
        })
    }

    fn builder(&self, key: &str, opts: Options) -> PyResult<LockBuilder> {
        Ok(opts.apply(self.inner.lock(key).py()?))
    }

    fn inspect_json(
        &self,
        key: &str,
    ) -> PyResult<impl std::future::Future<Output = PyResult<Option<String>>> + Send + 'static>
    {
        let key = leasehold::Key::new(key).py()?;
        let store = self.inner.store().clone();
        Ok(async move {
            match store.inspect(&key).await.py()? {
                None => Ok(None),
                Some(Inspection::Record(r)) => to_json(&r).map(Some),
                Some(Inspection::Corrupt { name, detail }) => {
                    Err(errors::from_error(leasehold::Error::Corrupt {
                        key: name,
                        detail,
                    }))
                }
            }
        })
    }
}

#[pymethods]
impl Locks {
    /// This client's holder identity.
    #[getter]
    fn holder(&self) -> String {
        self.inner.holder().to_string()
    }

    /// The store, described without credentials.
    #[getter]
    fn store(&self) -> String {
        self.inner.store().describe()
    }

    /// Takes the lease on `key` (awaitable): see `leasehold.Lock.acquire`.
    #[pyo3(signature = (key, cancel, *, ttl=None, wait=None, renew_every=None, waiter_ttl=None, register_waiter=true, labels=None))]
    #[allow(clippy::too_many_arguments)]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        cancel: &Bound<'_, Cancel>,
        ttl: Option<run::Secs>,
        wait: Option<run::Secs>,
        renew_every: Option<run::Secs>,
        waiter_ttl: Option<run::Secs>,
        register_waiter: bool,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = Options::new(ttl, wait, renew_every, waiter_ttl, register_waiter, labels)?;
        let b = self.builder(key, opts)?;
        run::awaitable_as(
            py,
            cancel
                .get()
                .guard(async move { b.acquire().await.py().map(Some) }),
            run::OnCancelled::Hand(Cancel::hand(cancel)?),
        )
    }

    /// The blocking form of `acquire`.
    #[pyo3(signature = (key, *, ttl=None, wait=None, renew_every=None, waiter_ttl=None, register_waiter=true, labels=None))]
    #[allow(clippy::too_many_arguments)]
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        key: &str,
        ttl: Option<run::Secs>,
        wait: Option<run::Secs>,
        renew_every: Option<run::Secs>,
        waiter_ttl: Option<run::Secs>,
        register_waiter: bool,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Lease> {
        let opts = Options::new(ttl, wait, renew_every, waiter_ttl, register_waiter, labels)?;
        let b = self.builder(key, opts)?;
        run::block_all(py, async move { b.acquire().await.py().map(Lease::new) })
    }

    /// Takes the lease on `key` if it is free (awaitable): `None` when held elsewhere.
    #[pyo3(signature = (key, cancel, *, ttl=None, renew_every=None, labels=None))]
    fn try_acquire<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        cancel: &Bound<'_, Cancel>,
        ttl: Option<run::Secs>,
        renew_every: Option<run::Secs>,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = Options::new(ttl, None, renew_every, None, false, labels)?;
        let b = self.builder(key, opts)?;
        run::awaitable_as(
            py,
            cancel
                .get()
                .guard(async move { b.try_acquire().await.py() }),
            run::OnCancelled::Hand(Cancel::hand(cancel)?),
        )
    }

    /// The blocking form of `try_acquire`.
    #[pyo3(signature = (key, *, ttl=None, renew_every=None, labels=None))]
    fn try_acquire_blocking(
        &self,
        py: Python<'_>,
        key: &str,
        ttl: Option<run::Secs>,
        renew_every: Option<run::Secs>,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Option<Lease>> {
        let opts = Options::new(ttl, None, renew_every, None, false, labels)?;
        let b = self.builder(key, opts)?;
        run::block_all(py, async move {
            Ok(b.try_acquire().await.py()?.map(Lease::new))
        })
    }

    /// The key's record as JSON text, the one `leasehold inspect` shows (awaitable); `None` when
    /// the store has none.
    fn inspect<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.inspect_json(key)?;
        run::awaitable(py, fut)
    }

    /// The blocking form of `inspect`.
    fn inspect_blocking(&self, py: Python<'_>, key: &str) -> PyResult<Option<String>> {
        let fut = self.inspect_json(key)?;
        run::block_all(py, fut)
    }

    /// Frees `key` whoever holds it, as `leasehold release --force` does (awaitable): the record
    /// it removed as JSON text, or `None` when the key was free. The holder's next renewal fails
    /// and its `lost()` fires.
    fn force_release<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.force_release_json(key)?;
        run::awaitable(py, fut)
    }

    /// The blocking form of `force_release`.
    fn force_release_blocking(&self, py: Python<'_>, key: &str) -> PyResult<Option<String>> {
        let fut = self.force_release_json(key)?;
        run::block_all(py, fut)
    }

    fn __repr__(&self) -> String {
        format!(
            "Locks(store={:?}, holder={:?})",
            self.store(),
            self.holder()
        )
    }
}

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(connect_async, m)?)?;
    m.add_function(wrap_pyfunction!(settle, m)?)?;
    m.add_class::<Locks>()?;
    m.add_class::<Lease>()?;
    m.add_class::<Cancel>()?;
    queue::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
