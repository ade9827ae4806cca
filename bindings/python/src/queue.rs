//! The per-key serialised task queue for Python (`leasehold.queue`).

use pyo3::prelude::*;

/// Adds the queue's classes to the module.
pub(crate) fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
