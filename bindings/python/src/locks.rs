//! Opening a store and the locks on it (`leasehold/_locks.py` builds the user API over these):
//! `connect`, `Locks`, one `LockOptions` value per acquisition, and `Lock`, the native form of
//! the library's `LockBuilder` for a lock, a semaphore's permit or a read-write lock's permit.

use crate::errors::{self, IntoPy};
use crate::lease::{Cancel, Lease};
use crate::run;
use leasehold::{HolderId, Inspection, LockBuilder, PermitRequest, Wait};
use pyo3::prelude::*;
use std::collections::BTreeMap;

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

/// A record as JSON text.
pub(crate) fn to_json(r: &leasehold::LeaseRecord) -> PyResult<String> {
    serde_json::to_string(r).map_err(|e| errors::internal(&format!("record to JSON: {e}")))
}

/// The wait policy of a wait in seconds as Python gives it: `None` without limit, `0` not at
/// all.
fn wait_policy(wait: Option<run::Secs>) -> PyResult<Wait> {
    Ok(match run::seconds("wait", wait)? {
        None => Wait::Forever,
        Some(d) if d.is_zero() => Wait::No,
        Some(d) => Wait::For(d),
    })
}

/// The options of an acquisition: the library's `LockOptions`, filled once from keywords
/// (seconds as `int` or `float`; `None` keeps the library's default).
#[pyclass(module = "leasehold._native", frozen)]
pub(crate) struct LockOptions {
    inner: leasehold::LockOptions,
}

#[pymethods]
impl LockOptions {
    #[new]
    #[pyo3(signature = (*, ttl=None, wait=None, renew_every=None, waiter_ttl=None, register_waiter=true, labels=None))]
    fn new(
        ttl: Option<run::Secs>,
        wait: Option<run::Secs>,
        renew_every: Option<run::Secs>,
        waiter_ttl: Option<run::Secs>,
        register_waiter: bool,
        labels: Option<BTreeMap<String, String>>,
    ) -> PyResult<Self> {
        let mut o = leasehold::LockOptions::default();
        if let Some(ttl) = run::seconds("ttl", ttl)? {
            o.ttl = ttl;
        }
        o.wait = wait_policy(wait)?;
        o.renew_every = run::seconds("renew_every", renew_every)?;
        o.waiter_ttl = run::seconds("waiter_ttl", waiter_ttl)?;
        o.register_waiter = register_waiter;
        o.labels = labels.unwrap_or_default();
        Ok(LockOptions { inner: o })
    }

    fn __repr__(&self) -> String {
        format!("LockOptions({:?})", self.inner)
    }
}

/// One client of one store, with one holder identity.
#[pyclass(module = "leasehold._native", frozen)]
pub(crate) struct Locks {
    pub(crate) inner: leasehold::Locks,
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

    fn make(&self, key: String, permit: Option<PermitRequest>, options: &LockOptions) -> Lock {
        Lock {
            locks: self.inner.clone(),
            key,
            permit,
            options: options.inner.clone(),
        }
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

    /// The lock on `key` with `options` (the key is checked when it is acquired).
    fn lock(&self, key: String, options: &LockOptions) -> Lock {
        self.make(key, None, options)
    }

    /// A permit of the semaphore `key` of `permits` permits (checked when it is acquired).
    fn semaphore(&self, key: String, permits: i64, options: &LockOptions) -> PyResult<Lock> {
        let permits = u32::try_from(permits).map_err(|_| {
            errors::invalid_option("permits", format!("{permits} is not a count of permits"))
        })?;
        Ok(self.make(key, Some(PermitRequest::Semaphore { permits }), options))
    }

    /// The read permit (`write=False`) or the write permit (`write=True`) of the read-write
    /// lock `key`.
    fn read_write(&self, key: String, write: bool, options: &LockOptions) -> Lock {
        let permit = if write {
            PermitRequest::Write
        } else {
            PermitRequest::Read
        };
        self.make(key, Some(permit), options)
    }

    /// The key's record as JSON text, the one `leasehold inspect` shows (awaitable); `None` when
    /// the store has none.
    fn inspect<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        let fut = self.inspect_json(key)?;
        run::awaitable(py, fut)
    }

    /// The blocking form of `inspect`.
    fn inspect_sync(&self, py: Python<'_>, key: &str) -> PyResult<Option<String>> {
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
    fn force_release_sync(&self, py: Python<'_>, key: &str) -> PyResult<Option<String>> {
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

/// A lock, or a permit of a semaphore or read-write lock, with its options: what the library's
/// `LockBuilder` holds, built at each acquisition.
#[pyclass(module = "leasehold._native", frozen)]
pub(crate) struct Lock {
    locks: leasehold::Locks,
    key: String,
    permit: Option<PermitRequest>,
    options: leasehold::LockOptions,
}

impl Lock {
    fn builder(&self) -> PyResult<LockBuilder> {
        let b = match self.permit {
            None => self.locks.lock(&self.key).py()?,
            Some(PermitRequest::Semaphore { permits }) => {
                self.locks.semaphore(&self.key, permits).py()?
            }
            Some(PermitRequest::Read) => self.locks.read_write(&self.key).py()?.read(),
            Some(PermitRequest::Write) => self.locks.read_write(&self.key).py()?.write(),
        };
        Ok(b.options(self.options.clone()))
    }
}

#[pymethods]
impl Lock {
    /// The key.
    #[getter]
    fn key(&self) -> String {
        self.key.clone()
    }

    /// The same lock with another wait (`None` without limit, `0` not at all).
    fn with_wait(&self, wait: Option<run::Secs>) -> PyResult<Lock> {
        let mut options = self.options.clone();
        options.wait = wait_policy(wait)?;
        Ok(Lock {
            locks: self.locks.clone(),
            key: self.key.clone(),
            permit: self.permit,
            options,
        })
    }

    /// Takes the lease (awaitable): see `leasehold.Lock.acquire`.
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        cancel: &Bound<'_, Cancel>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let b = self.builder()?;
        Cancel::awaitable(py, cancel, async move { b.acquire().await.py().map(Some) })
    }

    /// The blocking form of `acquire`.
    fn acquire_sync(&self, py: Python<'_>) -> PyResult<Lease> {
        let b = self.builder()?;
        run::block_all(py, async move { b.acquire().await.py().map(Lease::new) })
    }

    /// Takes the lease if it is free (awaitable): `None` when held elsewhere.
    fn try_acquire<'py>(
        &self,
        py: Python<'py>,
        cancel: &Bound<'_, Cancel>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let b = self.builder()?;
        Cancel::awaitable(py, cancel, async move { b.try_acquire().await.py() })
    }

    /// The blocking form of `try_acquire`.
    fn try_acquire_sync(&self, py: Python<'_>) -> PyResult<Option<Lease>> {
        let b = self.builder()?;
        run::block_all(py, async move {
            Ok(b.try_acquire().await.py()?.map(Lease::new))
        })
    }

    fn __repr__(&self) -> String {
        let kind = match self.permit {
            None => "lock".to_owned(),
            Some(PermitRequest::Semaphore { permits }) => format!("semaphore of {permits}"),
            Some(PermitRequest::Read) => "read permit".to_owned(),
            Some(PermitRequest::Write) => "write permit".to_owned(),
        };
        format!("Lock(key={:?}, {kind})", self.key)
    }
}

/// Adds the locks' functions and classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(connect_async, m)?)?;
    m.add_function(wrap_pyfunction!(settle, m)?)?;
    m.add_class::<Locks>()?;
    m.add_class::<LockOptions>()?;
    m.add_class::<Lock>()?;
    Ok(())
}
