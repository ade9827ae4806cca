//! Redis Cluster (`redis+cluster://[user:pass@]host1:port1,host2:port2,…[?prefix=…&timeout=…]`,
//! `rediss+cluster://…[?ca=…]` over TLS): the [Redis store](crate::redis)'s records, scripts and
//! guarantees on a cluster.
//!
//! * **Keys**: a key's record and fence counter carry the key as a hash tag —
//!   `leasehold:lock:{KEY}` and `leasehold:fence:{KEY}` — so they live in one slot and each
//!   operation stays one script call on the primary serving it. Operators use
//!   `redis-cli -c GET 'leasehold:lock:{KEY}'`. Prefixes may not contain `{` or `}`, and a key may
//!   not start with `}` (its hash tag would be empty, and the record and counter would land in
//!   different slots): both are refused with a clear error.
//! * **Routing**: the connection sends each call to the primary serving its slot and follows the
//!   cluster's `MOVED`/`ASK` answers and new slot maps itself, so a failover (a replica promoted)
//!   or a resharding needs nothing from the caller; calls fail with a retryable error meanwhile.
//! * **Renewals** are batched per slot: one script call per slot with due leases, all in flight at
//!   once over the connection to each primary.
//! * **Waiters** wake by pub/sub: the release script's `PUBLISH` reaches subscribers on every node
//!   of the cluster, so the store subscribes through any reachable seed node.
//! * **Listing** scans every primary.
//!
//! The seed nodes only start the connection: the store learns the cluster's other nodes from
//! them. They must share one user and password. As with one server, a failover can lose the last
//! grants and counter increments that had not reached the promoted replica (replication is
//! asynchronous): see the crate's README.

use crate::error::{Error, Result};
use crate::key::Key;
use crate::redis::{bounded, host_list, Conn, Origin, RedisOptions, RedisStore};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot};
use std::time::Duration;

/// What the URL of a cluster store names.
struct ClusterUrl {
    /// Each seed node's `redis://` (or `rediss://`) URL, with the user and password.
    nodes: Vec<String>,
    opts: RedisOptions,
}

/// Parses `redis+cluster://[user:pass@]h1:p1,h2:p2,…[/0][?…]` (or `rediss+cluster://`).
fn parse(url: &str, described: &str) -> Result<ClusterUrl> {
    let tls = url.starts_with("rediss+cluster://");
    let scheme = if tls {
        "rediss+cluster"
    } else {
        "redis+cluster"
    };
    let list = host_list(url, scheme, described)?;
    if !matches!(list.path, "" | "0") {
        return Err(Error::InvalidUrl {
            url: described.to_owned(),
            reason: "a Redis Cluster has only database 0: leave the path out".into(),
        });
    }
    let node_scheme = if tls { "rediss" } else { "redis" };
    let nodes = list
        .hosts
        .iter()
        .map(|host| format!("{node_scheme}://{}{host}", list.userinfo))
        .collect();
    let pairs = url::form_urlencoded::parse(list.query.as_bytes());
    let opts = RedisOptions::from_query(url, pairs, RedisOptions::default())?;
    for (name, prefix) in [
        ("prefix", Some(&opts.prefix)),
        ("fence_prefix", opts.fence_prefix.as_ref()),
    ] {
        if prefix.is_some_and(|p| p.contains(['{', '}'])) {
            return Err(Error::option(
                name,
                "a Redis Cluster prefix may not contain { or }: the key is the hash tag",
            ));
        }
    }
    Ok(ClusterUrl { nodes, opts })
}

impl RedisStore {
    /// Parses a `redis+cluster://` or `rediss+cluster://` URL and connects to the cluster.
    pub(crate) async fn from_cluster_url(url: &str) -> Result<Self> {
        let described = crate::redact_url(url);
        let ClusterUrl { nodes, opts } = parse(url, &described)?;
        let bad = |e: ::redis::RedisError| Error::InvalidUrl {
            url: described.clone(),
            reason: e.to_string(),
        };
        let mut builder = ::redis::cluster::ClusterClientBuilder::new(nodes.clone())
            .connection_timeout(opts.timeout)
            // Every call is bounded by the store's timeout; within it, the connection retries
            // redirections and reconnections.
            .response_timeout(opts.timeout)
            .retries(8)
            .min_retry_wait(10)
            .max_retry_wait(200);
        let mut clients = vec![];
        let tls_certs = |opts: &RedisOptions| -> Result<Option<::redis::TlsCertificates>> {
            let Some(ca) = &opts.ca_file else {
                return Ok(None);
            };
            let pem = std::fs::read(ca).map_err(|e| Error::io("read CA file", ca.display(), e))?;
            Ok(Some(::redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            }))
        };
        if url.starts_with("rediss+cluster://") {
            // Several crates may race to install a provider; any installed one will do.
            let _ = rustls::crypto::ring::default_provider().install_default();
        } else if opts.ca_file.is_some() {
            return Err(Error::InvalidUrl {
                url: described,
                reason: "?ca= needs a rediss+cluster:// URL".into(),
            });
        }
        let certs = tls_certs(&opts)?;
        if let Some(certs) = &certs {
            builder = builder.certs(certs.clone());
        }
        for node in &nodes {
            clients.push(
                match &certs {
                    Some(c) => ::redis::Client::build_with_tls(node.as_str(), c.clone()),
                    None => ::redis::Client::open(node.as_str()),
                }
                .map_err(bad)?,
            );
        }
        let client = builder.build().map_err(bad)?;
        let conn = bounded(
            &described,
            opts.timeout * 2,
            "no connection to the cluster",
            client.get_async_connection(),
        )
        .await?;
        let fence_prefix = crate::redis::checked_fence_prefix(&opts)?;
        let first = clients[0].clone();
        Ok(Self::assemble(
            Conn::Cluster(conn),
            first,
            Origin::Cluster(clients),
            ::redis::aio::ConnectionManagerConfig::new(),
            described,
            fence_prefix,
            opts,
        ))
    }
}

/// Refuses a key that cannot be a hash tag: one starting with `}` (its tag would be empty, so its
/// record and counter would hash to different slots).
pub(crate) fn check_key(key: &Key) -> Result<()> {
    if key.as_str().starts_with('}') {
        return Err(Error::InvalidKey {
            key: key.to_string(),
            reason: "a key on Redis Cluster may not start with } (the key is the hash tag)".into(),
        });
    }
    Ok(())
}

/// The hash slot of a record key.
pub(crate) fn slot(record_key: &str) -> Slot {
    Slot::for_key(record_key)
}

/// The cluster's primaries (`host`, `port`), from `CLUSTER SLOTS`.
async fn primaries(
    conn: &mut ClusterConnection,
    store: &str,
    timeout: Duration,
) -> Result<Vec<(String, u16)>> {
    let mut ask = ::redis::cmd("CLUSTER");
    ask.arg("SLOTS");
    let slots: Vec<Vec<::redis::Value>> = bounded(
        store,
        timeout,
        "no CLUSTER SLOTS answer",
        ask.query_async(conn),
    )
    .await?;
    let mut out: Vec<(String, u16)> = vec![];
    for range in slots {
        // [start, end, [host, port, id, …], replicas…]
        let node: Option<(String, u16)> = range
            .get(2)
            .and_then(|n| ::redis::from_redis_value_ref::<Vec<::redis::Value>>(n).ok())
            .and_then(|n| {
                let host = ::redis::from_redis_value_ref::<String>(n.first()?).ok()?;
                let port = ::redis::from_redis_value_ref::<u16>(n.get(1)?).ok()?;
                Some((host, port))
            });
        match node {
            Some(n) if !out.contains(&n) => out.push(n),
            Some(_) => {}
            None => {
                return Err(Error::Store {
                    store: store.to_owned(),
                    detail: "unreadable CLUSTER SLOTS answer".into(),
                    retryable: false,
                })
            }
        }
    }
    Ok(out)
}

/// The keys matching `pattern` on every primary (`SCAN` on each); none on one server.
pub(crate) async fn scan_all(
    conn: &Conn,
    pattern: &str,
    store: &str,
    timeout: Duration,
) -> Result<Vec<String>> {
    let Conn::Cluster(cluster) = conn else {
        return Ok(vec![]);
    };
    let mut cluster = cluster.clone();
    let mut names = vec![];
    for (host, port) in primaries(&mut cluster, store, timeout).await? {
        let mut cursor: u64 = 0;
        loop {
            let mut scan = ::redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            });
            let answer = bounded(
                store,
                timeout,
                "no SCAN answer",
                cluster.route_command(scan, route),
            )
            .await?;
            let (next, batch): (u64, Vec<String>) =
                ::redis::from_redis_value(answer).map_err(|e| Error::Store {
                    store: store.to_owned(),
                    detail: format!("unreadable SCAN answer: {e}"),
                    retryable: false,
                })?;
            names.extend(batch);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(names)
}
