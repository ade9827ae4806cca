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
    e.shared(store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::redis::{ErrorKind, RedisError, ServerErrorKind};
    use std::error::Error as _;

    const STORE: &str = "redis://h:1/0";

    /// The error of a server reply `line` (`CODE message`), as the connection hands it over.
    fn reply(line: &str) -> RedisError {
        match ::redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(::redis::Value::ServerError(e)) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    fn io(kind: std::io::ErrorKind, text: &str) -> RedisError {
        std::io::Error::new(kind, text.to_owned()).into()
    }

    /// `Some(retryable)` for an [`Error::Store`], `None` for an [`Error::Unavailable`].
    fn store_retryable(e: &Error) -> Option<bool> {
        match e {
            Error::Unavailable { .. } => None,
            Error::Store { retryable, .. } => Some(*retryable),
            other => panic!("neither Unavailable nor Store: {other:?}"),
        }
    }

    #[test]
    fn an_unreachable_server_is_unavailable() {
        for e in [
            io(std::io::ErrorKind::ConnectionRefused, "connection refused"),
            io(std::io::ErrorKind::ConnectionReset, "reset by peer"),
            io(std::io::ErrorKind::TimedOut, "timed out"),
            io(std::io::ErrorKind::BrokenPipe, "broken pipe"),
            RedisError::from((ErrorKind::Io, "the connection closed")),
        ] {
            let text = e.to_string();
            let mapped = map_err(STORE, e);
            assert_eq!(store_retryable(&mapped), None, "{text}: {mapped:?}");
            assert!(mapped.is_retryable());
            assert!(!mapped.is_no_answer(), "told by its source, not its text");
        }
    }

    #[test]
    fn a_cluster_in_motion_is_unavailable() {
        for e in [
            reply("MOVED 3999 127.0.0.1:6381"),
            reply("ASK 3999 127.0.0.1:6381"),
            reply("CLUSTERDOWN The cluster is down"),
            RedisError::from((ErrorKind::ClusterConnectionNotFound, "no connections found")),
        ] {
            let mapped = map_err(STORE, e);
            assert_eq!(store_retryable(&mapped), None, "{mapped:?}");
        }
    }

    #[test]
    fn a_demoted_primary_is_unavailable_and_read_only() {
        let e = reply("READONLY You can't write against a read only replica.");
        assert!(read_only(&e));
        assert!(!connection_refused(&e));
        let mapped = map_err(STORE, e);
        assert_eq!(store_retryable(&mapped), None);
        assert!(mapped.to_string().contains("read-only replica"), "{mapped}");
        assert!(!read_only(&reply("ERR unknown command")));
    }

    #[test]
    fn passing_server_conditions_are_retryable() {
        for (code, message) in [
            ("OOM", "command not allowed when used memory > 'maxmemory'."),
            ("BUSY", "Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."),
            ("LOADING", "Redis is loading the dataset in memory"),
            ("MISCONF", "Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."),
            ("NOREPLICAS", "Not enough good replicas to write."),
            ("TRYAGAIN", "Multiple keys request during rehashing of slot"),
            ("MASTERDOWN", "Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
            ("ERR", "max number of clients reached"),
        ] {
            let mapped = map_err(STORE, reply(&format!("{code} {message}")));
            assert_eq!(store_retryable(&mapped), Some(true), "{code}: {mapped:?}");
            let text = mapped.to_string();
            assert!(text.contains(message), "the server's words: {text}");
        }
    }

    #[test]
    fn refused_credentials_are_final() {
        let client = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert!(connection_refused(&client));
        for e in [
            client,
            reply("NOAUTH Authentication required."),
            reply("WRONGPASS invalid username-password pair or user is disabled."),
            reply("NOPERM User locker has no permissions to run the 'wait' command"),
            // The cluster client reports refused credentials inside an I/O error.
            io(
                std::io::ErrorKind::Other,
                "Failed to create initial connections - AuthenticationFailed",
            ),
        ] {
            let text = e.to_string();
            let mapped = map_err(STORE, e);
            assert_eq!(store_retryable(&mapped), Some(false), "{text}: {mapped:?}");
        }
    }

    #[test]
    fn an_untrusted_certificate_is_final() {
        let e = io(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        assert_eq!(store_retryable(&map_err(STORE, e)), Some(false));
    }

    #[test]
    fn an_answer_that_is_not_redis_is_final() {
        let e = RedisError::from((
            ErrorKind::Parse,
            "invalid response",
            "HTTP/1.1 400 Bad Request\r\nmore".to_owned(),
        ));
        assert!(connection_refused(&e));
        let mapped = map_err(STORE, e);
        assert_eq!(store_retryable(&mapped), Some(false));
        let text = mapped.to_string();
        assert!(text.contains("not Redis"), "{text}");
        assert!(!text.contains("more"), "only the first line: {text}");
    }

    #[test]
    fn other_refusals_are_final() {
        for e in [
            reply("ERR unknown command 'FOO'"),
            reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
            reply("NOSCRIPT No matching script."),
            RedisError::from((ErrorKind::UnexpectedReturnType, "not a number")),
        ] {
            let text = e.to_string();
            let mapped = map_err(STORE, e);
            assert_eq!(store_retryable(&mapped), Some(false), "{text}: {mapped:?}");
        }
    }

    #[test]
    fn too_few_replicas_is_retryable() {
        let e = RedisError::from((
            ErrorKind::Client,
            NOT_REPLICATED,
            "0 of 1 acknowledged it within 250 ms (replicas, replicas_timeout)".to_owned(),
        ));
        let mapped = map_err(STORE, e);
        assert_eq!(store_retryable(&mapped), Some(true));
        assert_eq!(
            mapped.to_string(),
            format!("store {STORE} error: {NOT_REPLICATED}: 0 of 1 acknowledged it within 250 ms (replicas, replicas_timeout)")
        );
        // Another client error is not.
        let other = RedisError::from((ErrorKind::Client, "WAIT answered no number"));
        assert_eq!(store_retryable(&map_err(STORE, other)), Some(false));
    }

    #[test]
    fn the_redis_error_is_the_source() {
        let source = |e: &Error| e.source_arc().expect("a source");
        let full = map_err(STORE, reply("OOM command not allowed"));
        let oom = source(&full);
        let oom = oom.downcast_ref::<RedisError>();
        assert_eq!(oom.and_then(|s| s.code()), Some("OOM"));
        assert!(full.source().is_some());
        let demoted = source(&map_err(STORE, reply("READONLY replica")));
        assert_eq!(
            demoted.downcast_ref::<RedisError>().map(|s| s.kind()),
            Some(ErrorKind::Server(ServerErrorKind::ReadOnly))
        );
    }

    #[test]
    fn a_shared_error_keeps_its_meaning_for_each_caller() {
        let unavailable = map_err(STORE, io(std::io::ErrorKind::ConnectionReset, "reset"));
        let shared = shared_error("redis://other:2/0", &unavailable);
        assert_eq!(shared.to_string(), unavailable.to_string(), "as it is");
        assert!(shared.source_arc().is_some());
        let busy = map_err(STORE, reply("BUSY running a script"));
        let shared = shared_error("redis://other:2/0", &busy);
        assert_eq!(store_retryable(&shared), Some(true));
        assert!(shared
            .to_string()
            .starts_with("store redis://other:2/0 error: "));
        assert!(shared.to_string().contains("BUSY"), "{shared}");
        assert!(shared.source_arc().is_some());
        let corrupt = Error::Corrupt {
            key: "k".into(),
            detail: "bad".into(),
        };
        assert_eq!(
            store_retryable(&shared_error("redis://other:2/0", &corrupt)),
            Some(false)
        );
    }
}
