//! The library's errors as the Python exception classes of `leasehold.errors`, each with its
//! fields and `retryable`.

use leasehold::Error;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An instance of `leasehold.errors.<class>` made with `message`, with `fields` set on it.
fn raise(class: &str, message: String, fields: &[(&str, Field)]) -> PyErr {
    Python::attach(|py| {
        let made = (|| -> PyResult<PyErr> {
            let module =
                ERRORS.get_or_try_init(py, || py.import("leasehold.errors").map(|m| m.unbind()))?;
            let value = module.bind(py).getattr(class)?.call1((message.clone(),))?;
            for (name, field) in fields {
                match field {
                    Field::Text(t) => value.setattr(*name, t)?,
                    Field::Flag(b) => value.setattr(*name, *b)?,
                    Field::Seconds(s) => value.setattr(*name, *s)?,
                }
            }
            Ok(PyErr::from_value(value))
        })();
        made.unwrap_or_else(|e| e)
    })
}

enum Field {
    Text(String),
    Flag(bool),
    Seconds(f64),
}

/// The Python exception for a library error.
pub(crate) fn from_error(e: Error) -> PyErr {
    let retryable = Field::Flag(e.is_retryable());
    let message = e.to_string();
    match e {
        Error::InvalidKey { key, .. } => raise(
            "InvalidKey",
            message,
            &[("key", Field::Text(key)), ("retryable", retryable)],
        ),
        Error::InvalidUrl { url, .. } => raise(
            "InvalidUrl",
            message,
            &[("url", Field::Text(url)), ("retryable", retryable)],
        ),
        Error::InvalidOption { name, .. } => raise(
            "InvalidOption",
            message,
            &[
                ("option", Field::Text(name.into())),
                ("retryable", retryable),
            ],
        ),
        Error::FeatureNotEnabled { .. } => {
            raise("FeatureNotEnabled", message, &[("retryable", retryable)])
        }
        Error::Timeout {
            key,
            holder,
            waited,
        } => raise(
            "Timeout",
            message,
            &[
                ("key", Field::Text(key)),
                ("holder", Field::Text(holder)),
                ("waited", Field::Seconds(waited.as_secs_f64())),
                ("retryable", retryable),
            ],
        ),
        Error::Corrupt { key, .. } => raise(
            "Corrupt",
            message,
            &[("key", Field::Text(key)), ("retryable", retryable)],
        ),
        Error::Io { path, .. } => raise(
            "StoreIOError",
            message,
            &[("path", Field::Text(path)), ("retryable", retryable)],
        ),
        Error::Unavailable { store, .. } => raise(
            "Unavailable",
            message,
            &[("store", Field::Text(store)), ("retryable", retryable)],
        ),
        Error::Store { store, .. } => raise(
            "StoreError",
            message,
            &[("store", Field::Text(store)), ("retryable", retryable)],
        ),
        Error::NotSupported { store, .. } => raise(
            "NotSupported",
            message,
            &[("store", Field::Text(store)), ("retryable", retryable)],
        ),
        Error::GivenUp { key } => raise(
            "GivenUp",
            message,
            &[("key", Field::Text(key)), ("retryable", retryable)],
        ),
        Error::NotFound { .. } => raise("NotFound", message, &[("retryable", retryable)]),
        _ => raise("LeaseholdError", message, &[("retryable", retryable)]),
    }
}

/// An option's value refused: the library's `InvalidOption` as its Python exception.
pub(crate) fn invalid_option(name: &'static str, reason: String) -> PyErr {
    from_error(Error::InvalidOption { name, reason })
}

/// A call in a child forked after the runtime started (`why` says in which process).
pub(crate) fn forked(why: &leasehold::runtime::RuntimeError) -> PyErr {
    raise(
        "ForkedProcessError",
        format!(
            "{why}. Use leasehold in the child only if the parent had not used it yet, or start \
             children with multiprocessing's 'spawn' or 'forkserver' method."
        ),
        &[("retryable", Field::Flag(false))],
    )
}

/// A defect of the binding itself.
pub(crate) fn internal(what: &str) -> PyErr {
    raise(
        "LeaseholdError",
        format!("leasehold internal error: {what}"),
        &[("retryable", Field::Flag(false))],
    )
}

/// `Result` from the library as a Python result.
pub(crate) trait IntoPy<T> {
    /// The value, or the error as its Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for leasehold::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(from_error)
    }
}
