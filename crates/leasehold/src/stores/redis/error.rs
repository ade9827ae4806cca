//! How the Redis store reads the redis crate's errors: each `redis::RedisError` as the
//! [`Error`] it means, saying whether a retry can help ([`map_err`]), with the client's error
//! kept as its source.

use crate::error::Error;

/// The description of the error a replicated write answers when too few replicas acknowledged it
/// ([`ScriptCall::send_replicated`](super::scripts::ScriptCall::send_replicated)).
pub(super) const NOT_REPLICATED: &str = "the write did not reach the replicas asked for";

/// Whether a call failed because its connection could not be made, for a reason the connection
/// manager keeps (it connects again only after an I/O error): the server answered something that
/// is not Redis, or refused the credentials. Our calls send no `AUTH`, and a Redis server answers
/// nothing unreadable, so neither comes from a call that reached a server.
pub(crate) fn connection_refused(e: &::redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ::redis::ErrorKind::Parse | ::redis::ErrorKind::AuthenticationFailed
    )
}

/// Whether the server refused a write as a replica (`READONLY`).
pub(super) fn read_only(e: &::redis::RedisError) -> bool {
    e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::ReadOnly)
}

/// The [`Error`] the Redis error `e` of a call to `store` means, with `e` as its source.
pub(crate) fn map_err(store: &str, e: ::redis::RedisError) -> Error {
    classify(store, &e).caused_by(e)
}

/// The [`Error`] a Redis error means (see [`map_err`]), without its source.
fn classify(store: &str, e: &::redis::RedisError) -> Error {
    let text = e.to_string();
    if e.kind() == ::redis::ErrorKind::Client && text.contains(NOT_REPLICATED) {
        // A replica missing or lagging: passing, as a full server's refusal is.
        return Error::Store {
            source: None,
            store: store.to_owned(),
            detail: format!("{NOT_REPLICATED}: {}", e.detail().unwrap_or_default()),
            retryable: true,
        };
    }
    if read_only(e) {
        // A failover demoted the server; the store connects again (see `link::Link`).
        return Error::Unavailable {
            source: None,
            store: store.to_owned(),
            detail: format!(
                "the server is a read-only replica now (a failover?); connecting again: {text}"
            ),
        };
    }
    // A TLS trust failure or refused credentials do not heal by retrying (the cluster client
    // reports the latter inside an I/O error: "Failed to create initial connections").
    if text.to_ascii_lowercase().contains("certificate")
        || e.kind() == ::redis::ErrorKind::AuthenticationFailed
        || text.contains("AuthenticationFailed")
    {
        return Error::Store {
            source: None,
            store: store.to_owned(),
            detail: text,
            retryable: false,
        };
    }
    if e.kind() == ::redis::ErrorKind::Parse {
        return Error::Store {
            source: None,
            store: store.to_owned(),
            detail: format!(
                "the server answered something that is not Redis (a wrong port, or a proxy or another service in the way?): {}",
                text.lines().next().unwrap_or_default()
            ),
            retryable: false,
        };
    }
    // A cluster in motion (a failover, a resharding): the connection retried its redirections
    // and they still lead nowhere live; the slot is served again once a replica takes over.
    let cluster_moving = matches!(
        e.kind(),
        ::redis::ErrorKind::Server(
            ::redis::ServerErrorKind::Moved
                | ::redis::ServerErrorKind::Ask
                | ::redis::ServerErrorKind::ClusterDown
        ) | ::redis::ErrorKind::ClusterConnectionNotFound
    );
    if cluster_moving
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
    {
        Error::Unavailable {
            source: None,
            store: store.to_owned(),
            detail: e.to_string(),
        }
    } else {
        // Passing conditions of the server: loading its data, out of memory (`maxmemory` with
        // `noeviction` refuses writes until keys expire or are deleted), busy running a script,
        // unable to persist (`MISCONF`), full of clients. A holder keeps renewing through them until
        // its lease could have expired; a waiter keeps waiting.
        let retryable = matches!(
            e.kind(),
            ::redis::ErrorKind::Server(::redis::ServerErrorKind::BusyLoading)
                | ::redis::ErrorKind::Server(::redis::ServerErrorKind::TryAgain)
                | ::redis::ErrorKind::Server(::redis::ServerErrorKind::MasterDown)
        ) || matches!(
            e.code(),
            // NOREPLICAS: fewer replicas than the server's `min-replicas-to-write` are in touch.
            Some("OOM" | "BUSY" | "MISCONF" | "NOREPLICAS")
        ) || text.contains("max number of clients reached");
        Error::Store {
            source: None,
            store: store.to_owned(),
            detail: e.to_string(),
            retryable,
        }
    }
}

/// The error `e` of a call that carried several callers' operations, for one of them: an
/// [`Error::Unavailable`] as it is (Redlock tells a node that did not answer in time by it),
/// anything else as an [`Error::Store`] with its text and retryability.
pub(super) fn shared_error(store: &str, e: &Error) -> Error {
    match e {
        Error::Unavailable {
            store,
            detail,
            source,
        } => Error::Unavailable {
            store: store.clone(),
            detail: detail.clone(),
            source: source.clone(),
        },
        other => Error::Store {
            source: other.source_arc(),
            store: store.to_owned(),
            detail: other.to_string(),
            retryable: other.is_retryable(),
        },
    }
}
