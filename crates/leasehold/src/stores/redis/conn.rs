//! The Redis store's connections as the redis crate makes them: the command connection
//! ([`Conn`]: to one server, or to a Redis Cluster), clients for `redis://` and `rediss://` URLs
//! ([`open_client`]), a call bounded by the store's timeout ([`bounded`]), and `SCAN` page by page
//! ([`scan`]). Replacing a connection when its server fails over is the link's work, one layer
//! up (`link.rs`).

use super::error::map_err;
use super::options::RedisOptions;
use crate::error::{Error, Result};
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// The command connection: to one server, or to a Redis Cluster; with, for a store whose grants
/// and renewals wait for replicas ([`RedisOptions::replicas`]), a second one made from the same
/// client that carries those calls alone ([`Conn::waits`]).
#[derive(Clone)]
pub(crate) enum Conn {
    One(ConnectionManager, Option<ConnectionManager>),
    #[cfg(feature = "redis-cluster")]
    Cluster(
        ::redis::cluster_async::ClusterConnection,
        Option<::redis::cluster_async::ClusterConnection>,
    ),
}

impl Conn {
    /// A connection to one server made from `client` on first use, with a second one for calls
    /// that wait for replicas when `waits`.
    pub(super) fn lazy(
        client: &::redis::Client,
        config: &ConnectionManagerConfig,
        waits: bool,
    ) -> ::redis::RedisResult<Self> {
        let new = || ConnectionManager::new_lazy_with_config(client.clone(), config.clone());
        Ok(Conn::One(new()?, if waits { Some(new()?) } else { None }))
    }

    /// The connection for calls that wait for replicas (`WAIT`, which holds the connection it
    /// is sent on until the replicas answer or its timeout runs out): its own, so that while a
    /// replica does not answer, releases, inspections and listings are not held up behind it.
    /// A store without replicas has one connection for all.
    pub(super) fn waits(&self) -> Conn {
        match self {
            Conn::One(calls, waits) => Conn::One(waits.as_ref().unwrap_or(calls).clone(), None),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(calls, waits) => {
                Conn::Cluster(waits.as_ref().unwrap_or(calls).clone(), None)
            }
        }
    }
}

impl ::redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        match self {
            Conn::One(c, _) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c, _) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        match self {
            Conn::One(c, _) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c, _) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::One(c, _) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c, _) => c.get_db(),
        }
    }
}

/// A client for `redis://` or `rediss://` (TLS through rustls with the ring provider; the CA from
/// `ca_file` or the system trust store).
pub(super) fn open_client(
    url: &str,
    opts: &RedisOptions,
    described: &str,
) -> Result<::redis::Client> {
    let bad = |reason: String| Error::InvalidUrl {
        url: described.to_owned(),
        reason,
    };
    let tls = url.starts_with("rediss://");
    if tls {
        // Several crates may race to install a provider; any installed one will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    if !tls && opts.names_tls_files() {
        return Err(bad("?ca=, ?cert= and ?key= need a rediss:// URL".into()));
    }
    match opts.tls_certificates()? {
        Some(certs) if tls => {
            ::redis::Client::build_with_tls(url, certs).map_err(|e| bad(e.to_string()))
        }
        _ => ::redis::Client::open(url).map_err(|e| bad(e.to_string())),
    }
}

/// Awaits a Redis call for at most `timeout`; a late answer is [`Error::Unavailable`] saying
/// `what` did not come in time.
pub(crate) async fn bounded<T>(
    store: &str,
    timeout: Duration,
    what: &str,
    call: impl std::future::Future<Output = ::redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r.map_err(|e| map_err(store, e)),
        Err(_) => Err(Error::Unavailable {
            source: None,
            store: store.to_owned(),
            detail: format!("{what} in time"),
        }),
    }
}

/// The keys matching `pattern`: `SCAN` page by page, each page's command sent by `send`.
pub(crate) async fn scan<F, Fut>(pattern: &str, mut send: F) -> Result<Vec<String>>
where
    F: FnMut(::redis::Cmd) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, Vec<String>)>>,
{
    let mut names = vec![];
    let mut cursor: u64 = 0;
    loop {
        let mut page = ::redis::cmd("SCAN");
        page.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, batch) = send(page).await?;
        names.extend(batch);
        cursor = next;
        if cursor == 0 {
            return Ok(names);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unix_socket_client_takes_db_user_and_pass_from_the_query() {
        let url = "redis+unix:///run/redis.sock?db=2&user=u&pass=secret";
        let client =
            open_client(url, &RedisOptions::default(), &crate::url::redact(url)).expect("a client");
        let info = client.get_connection_info();
        let redis = info.redis_settings();
        assert_eq!(redis.db(), 2);
        assert_eq!(
            (redis.username(), redis.password()),
            (Some("u"), Some("secret"))
        );
        assert!(
            matches!(info.addr(), ::redis::ConnectionAddr::Unix(p) if p.ends_with("redis.sock"))
        );
    }

    #[test]
    fn tls_files_need_a_tls_url() {
        let opts = RedisOptions {
            ca_file: Some("/etc/ca.pem".into()),
            ..RedisOptions::default()
        };
        let e = open_client("redis://h:1/0", &opts, "redis://h:1/0").err();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.to_string().contains("need a rediss:// URL")),
            "{e:?}"
        );
        // Over TLS, the named CA is read (and here missing).
        let e = open_client("rediss://h:1/0", &opts, "rediss://h:1/0").err();
        assert!(
            matches!(
                e,
                Some(Error::Io {
                    op: "read CA file",
                    ..
                })
            ),
            "{e:?}"
        );
    }

    #[test]
    fn a_url_the_redis_crate_refuses_is_named_without_its_password() {
        let url = "redis://u:hunter2@h:1/notadb";
        let e = open_client(url, &RedisOptions::default(), &crate::url::redact(url)).err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.starts_with("invalid store URL \"redis://u:***@h:1/notadb\""),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
}
