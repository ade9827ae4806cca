//! `leasehold._native`: the Rust core of the `leasehold` Python package. The package's Python
//! layer (`python/leasehold/`) builds the user API (context managers, handlers) over it, one
//! Python module per Rust module: `locks.rs` under `_locks.py`, `lease.rs` under `_lease.py`,
//! `queue.rs` under `queue.py`, `errors.rs` under `errors.py` (`run.rs`, the asyncio bridge, is
//! the native side's own). Its stubs are `python/leasehold/_native.pyi`. Each call that waits
//! comes in two forms: `X` (awaitable) and `X_sync` (blocking, with the GIL released).

// The asyncio bridge answers through an eventfd (`run.rs`): Linux only.
#[cfg(not(target_os = "linux"))]
compile_error!("the leasehold Python package runs on Linux only (its asyncio bridge uses eventfd)");

mod errors;
mod lease;
mod locks;
mod queue;
mod run;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    locks::register(m)?;
    lease::register(m)?;
    queue::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
