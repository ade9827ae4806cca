//! Redis Cluster (`redis+cluster://[user:pass@]host1:port1,host2:port2,…[?prefix=…&timeout=…]`,
//! `rediss+cluster://…[?ca=…]` over TLS): the [Redis store](crate::stores::redis)'s records, scripts and
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
//! * **Renewals** are batched per primary: one script call to each primary the slot map names,
//!   for the due leases of all its slots (up to 1,000 a call; the call names no keys, since
//!   declared keys must share a slot, and carries the `allow-cross-slot-keys` flag of Redis 7). A
//!   record the primary does not serve (a failover or resharding since the map was read) is
//!   answered "elsewhere", never lost, and renewed by a call naming its key, which follows
//!   `MOVED`/`ASK`; a node refusing the call itself (before Redis 7) gets calls per slot.
//! * **Acquisitions and releases** made at once share script calls per primary
//!   (as on one server): a batch goes to one primary naming no keys (the same flag), an
//!   operation whose key it no longer serves is answered "elsewhere" without running and sent
//!   again naming its key; without a fresh slot map calls go alone.
//! * **Waiters** wake by pub/sub on the primary serving the key's slot, where the release script
//!   publishes (one pub/sub connection per primary, found from `CLUSTER SLOTS`). A cluster also
//!   forwards every `PUBLISH` to the other nodes, but over its bus, where a message waits up to
//!   ≈ 40 ms now and then (measured here with two plain clients); a subscription on another node —
//!   after a failover, until the slot map is read again, or when the slot's primary cannot be
//!   reached and a seed node stands in — still hears every release, only later.
//! * **Listing** scans every primary.
//!
//! The seed nodes only start the connection: the store learns the cluster's other nodes from
//! them. They must share one user and password. As with one server, a failover can lose the last
//! grants and counter increments that had not reached the promoted replica (replication is
//! asynchronous): see the book's Redis page, `docs/src/stores/redis.md#replication`.
//!
//! This module knows the cluster's nodes (its URL, slot map, pub/sub hubs); it sits below the
//! link, which asks it for a new connection or why none can be made, and above the connection
//! layer (`conn.rs`). It never reaches for the store.

use super::conn::{bounded, scan, Conn};
use super::error::{connection_refused, map_err};
use super::options::{checked, host_list, Checked, RedisOptions};
use super::pubsub::Hub;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::url::Params;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the URL of a cluster store names.
pub(super) struct ClusterUrl {
    /// Each seed node's `redis://` (or `rediss://`) URL, with the user and password.
    nodes: Vec<String>,
    pub(super) opts: RedisOptions,
    checked: Checked,
}

/// Reads the URL of `opts`, `redis+cluster://[user:pass@]h1:p1,h2:p2,…[/0]` (or
/// `rediss+cluster://`), and checks the options.
pub(super) fn parse(opts: RedisOptions, described: &str) -> Result<ClusterUrl> {
    let url = opts.url.as_str();
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
    // The store's own parameters are the options'.
    Params::of_query(url, list.query)
        .finish_noting("; the store's own go to RedisOptions::from_url")?;
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
    let checked = checked(&opts, described)?;
    Ok(ClusterUrl {
        nodes,
        opts,
        checked,
    })
}

/// A cluster connected to, for the store to use.
pub(super) struct Opened {
    /// The command connection.
    pub(super) conn: Conn,
    /// A client of the first seed node (the link's client).
    pub(super) seed: ::redis::Client,
    /// The cluster's nodes.
    pub(super) nodes: ClusterNodes,
    /// What the store takes from its options.
    pub(super) checked: Checked,
    /// The options the URL gives.
    pub(super) opts: RedisOptions,
}

/// Connects to the cluster of `opts` (a `redis+cluster://` or `rediss+cluster://` URL);
/// `described` (the URL without its secrets) names it in errors.
pub(super) async fn open(opts: RedisOptions, described: &str) -> Result<Opened> {
    let tls = opts.url.starts_with("rediss+cluster://");
    let ClusterUrl {
        nodes,
        opts,
        checked,
    } = parse(opts, described)?;
    let bad = |e: ::redis::RedisError| Error::InvalidUrl {
        url: described.to_owned(),
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
    if tls {
        // Several crates may race to install a provider; any installed one will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    } else if opts.names_tls_files() {
        return Err(Error::InvalidUrl {
            url: described.to_owned(),
            reason: "?ca=, ?cert= and ?key= need a rediss+cluster:// URL".into(),
        });
    }
    let certs = opts.tls_certificates()?;
    if let Some(certs) = &certs {
        builder = builder.certs(certs.clone());
    }
    let mut clients = vec![];
    for node in &nodes {
        clients.push(node_client(node, None, &certs).map_err(bad)?);
    }
    let client = builder.build().map_err(bad)?;
    let conn = connect(&client, described, opts.timeout, checked.wait.is_some()).await?;
    let first = clients[0].clone();
    let nodes = ClusterNodes {
        client,
        seeds: clients,
        node_url: nodes[0].clone(),
        certs,
        map: parking_lot::Mutex::new(None),
        ask_of: parking_lot::Mutex::new(vec![]),
        reading_map: AtomicBool::new(false),
        hubs: tokio::sync::Mutex::new(HashMap::new()),
    };
    Ok(Opened {
        conn,
        seed: first,
        nodes,
        checked,
        opts,
    })
}

/// A connection to the cluster `client` names (it reads the slot map from the nodes that answer),
/// bounded by twice the store's timeout, with a second one for calls that wait for replicas when
/// `waits` ([`Conn::waits`]).
async fn connect(
    client: &::redis::cluster::ClusterClient,
    store: &str,
    timeout: Duration,
    waits: bool,
) -> Result<Conn> {
    let one = || {
        bounded(
            store,
            timeout * 2,
            "no connection to the cluster",
            client.get_async_connection(),
        )
    };
    let calls = one().await?;
    let waits = if waits { Some(one().await?) } else { None };
    Ok(Conn::Cluster(calls, waits))
}

/// A client for the node at `node` (a seed's URL), or at `addr` (`host`, `port`) with that URL's
/// scheme and credentials; over TLS with `certs` when given.
fn node_client(
    node: &str,
    addr: Option<(&str, u16)>,
    certs: &Option<::redis::TlsCertificates>,
) -> ::redis::RedisResult<::redis::Client> {
    let mut url = node.to_owned();
    if let Some((host, port)) = addr {
        let moved = url::Url::parse(node).ok().and_then(|mut u| {
            u.set_host(Some(host)).ok()?;
            u.set_port(Some(port)).ok()?;
            Some(u)
        });
        let Some(moved) = moved else {
            return Err(::redis::RedisError::from((
                ::redis::ErrorKind::InvalidClientConfig,
                "cannot make a node's URL",
                format!("{host}:{port}"),
            )));
        };
        url = moved.into();
    }
    let info = ::redis::IntoConnectionInfo::into_connection_info(url.as_str())?;
    match certs {
        Some(c) => ::redis::Client::build_with_tls(info, c.clone()),
        None => ::redis::Client::open(info),
    }
}

/// The cluster's nodes as the store knows them, for pub/sub.
pub(crate) struct ClusterNodes {
    /// The cluster client, for a new connection when calls run out of time
    /// ([`ClusterNodes::reconnect`]).
    client: ::redis::cluster::ClusterClient,
    /// The seed nodes' clients (pub/sub falls back to them).
    seeds: Vec<::redis::Client>,
    /// The first seed's URL: other nodes' URLs are made from it.
    node_url: String,
    certs: Option<::redis::TlsCertificates>,
    /// Which primary serves each slot range, and when that was read.
    map: parking_lot::Mutex<Option<(Instant, Arc<Vec<SlotRange>>)>>,
    /// A slot of each primary of the last slot map read: the next read asks them all (and one
    /// node at random), forgotten or not.
    ask_of: parking_lot::Mutex<Vec<u16>>,
    /// A read of the slot map started in the background is under way ([`Self::claim_map_read`]).
    reading_map: AtomicBool,
    /// One pub/sub hub per node (`host`, `port`).
    hubs: tokio::sync::Mutex<HashMap<Node, Arc<Hub>>>,
}

/// A node's host and port.
pub(super) type Node = (String, u16);

/// Slots `start..=end` and the primary serving them.
struct SlotRange {
    start: u16,
    end: u16,
    node: Node,
}

/// How long a slot map read from the cluster is used before it is read again.
const MAP_AGE: Duration = Duration::from_secs(5);

/// A slot of each primary in `map`.
fn one_slot_each(map: &[SlotRange]) -> Vec<u16> {
    let mut seen: Vec<(&Node, u16)> = vec![];
    for r in map {
        if !seen.iter().any(|(n, _)| *n == &r.node) {
            seen.push((&r.node, r.start));
        }
    }
    seen.into_iter().map(|(_, slot)| slot).collect()
}

/// The primary serving `slot` in `map`.
fn serving(map: &[SlotRange], slot: u16) -> Option<&Node> {
    map.iter()
        .find(|r| r.start <= slot && slot <= r.end)
        .map(|r| &r.node)
}

impl ClusterNodes {
    /// The slot map, if it is younger than [`MAP_AGE`].
    fn fresh_map(&self) -> Option<Arc<Vec<SlotRange>>> {
        let map = self.map.lock();
        let (read, ranges) = map.as_ref()?;
        (read.elapsed() <= MAP_AGE).then(|| ranges.clone())
    }

    /// The slot map, read again first when it is missing or stale; `None` if it cannot be read.
    async fn map_or_read(
        &self,
        conn: &Conn,
        store: &str,
        timeout: Duration,
    ) -> Option<Arc<Vec<SlotRange>>> {
        if let Some(map) = self.fresh_map() {
            return Some(map);
        }
        self.read_map(conn, store, timeout).await;
        self.fresh_map()
    }

    /// A new connection to the cluster after calls ran out of time, or `None`.
    ///
    /// The crate's connection learns of a failover only from an error (`MOVED`, a dropped
    /// connection). A primary that hangs — stopped, or behind a partition that drops packets —
    /// gives none: calls to its slots ran out of time forever, even long after the cluster had
    /// promoted its replica. A new connection reads the slot map afresh from the nodes that
    /// answer. The store's own slot map is forgotten too (read again on next use).
    pub(crate) async fn reconnect(
        &self,
        store: &str,
        timeout: Duration,
        waits: bool,
    ) -> Option<Conn> {
        *self.map.lock() = None;
        match connect(&self.client, store, timeout, waits).await {
            Ok(conn) => Some(conn),
            Err(e) => {
                tracing::warn!(store, error = %e, "cannot connect to the cluster again");
                None
            }
        }
    }

    /// Why the cluster connection finds no node to send to, when the nodes refuse it: a new
    /// connection to every seed at once, with the store's credentials. A refusal the connection
    /// would keep ([`connection_refused`]: refused credentials, an answer that is
    /// not Redis) when no seed accepts; `None` as soon as one does (or when none answers at all:
    /// the nodes are down, which the call's own error says). A seed that hangs holds up nothing.
    ///
    /// The cluster connection reports a node it could not connect to as "no connections found",
    /// whatever the cause, and keeps retrying: refused credentials would read as a passing
    /// failure, and waiters would wait out their limits.
    pub(crate) async fn refusal(&self, timeout: Duration) -> Option<::redis::RedisError> {
        use futures_util::StreamExt;
        let config = ::redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut tries: futures_util::stream::FuturesUnordered<_> = self
            .seeds
            .iter()
            .map(|seed| seed.get_multiplexed_async_connection_with_config(&config))
            .collect();
        let mut refused = None;
        while let Some(tried) = tries.next().await {
            match tried {
                Ok(_) => return None,
                Err(e) if refused.is_none() && connection_refused(&e) => refused = Some(e),
                Err(_) => {}
            }
        }
        refused
    }

    /// Reads the slot map from the cluster (when it is missing, stale or forgotten).
    pub(crate) async fn read_map(&self, conn: &Conn, store: &str, timeout: Duration) {
        if let Conn::Cluster(c, _) = conn {
            let ask_of = self.ask_of.lock().clone();
            match slot_map(c, store, timeout, &ask_of).await {
                Ok(ranges) => {
                    *self.ask_of.lock() = one_slot_each(&ranges);
                    *self.map.lock() = Some((Instant::now(), Arc::new(ranges)));
                }
                Err(e) => tracing::debug!(store, error = %e, "no slot map"),
            }
        }
    }

    /// Whether the caller may start a read of the slot map in the background (no other is under
    /// way); [`Self::end_map_read`] ends the claim (other reads, a renewal's, leave it).
    pub(crate) fn claim_map_read(&self) -> bool {
        !self.reading_map.swap(true, Ordering::AcqRel)
    }

    /// Ends the claim of [`Self::claim_map_read`].
    pub(crate) fn end_map_read(&self) {
        self.reading_map.store(false, Ordering::Release);
    }

    /// What `f` makes of the primary serving `slot` by a fresh slot map, or `None` (the
    /// coalescing lanes of that primary, say).
    pub(super) fn with_primary<R>(&self, slot: u16, f: impl FnOnce(&Node) -> R) -> Option<R> {
        let map = self.fresh_map()?;
        let node = serving(&map, slot)?;
        Some(f(node))
    }

    /// Forgets the slot map (found out of date), so that it is read again.
    pub(crate) fn forget_map(&self) {
        *self.map.lock() = None;
    }

    /// `items` grouped by the primary serving the slot of their `key` in the slot map (read
    /// again when stale), each group with a route to that primary: by the slot of one of its
    /// keys, so the connection resolves it with its own map and reconnects as it would for a
    /// key. Items of slots the map does not name form a group without a route.
    pub(crate) async fn by_primary<J>(
        &self,
        conn: &Conn,
        items: Vec<J>,
        key: impl Fn(&J) -> &String,
        store: &str,
        timeout: Duration,
    ) -> Vec<(Option<RoutingInfo>, Vec<J>)> {
        let map = self.map_or_read(conn, store, timeout).await;
        let mut groups: HashMap<Option<Node>, (u16, Vec<J>)> = HashMap::new();
        for j in items {
            let slot = slot(key(&j));
            let node = map.as_ref().and_then(|m| serving(m, slot)).cloned();
            let group = groups.entry(node).or_insert((slot, vec![]));
            group.1.push(j);
        }
        groups
            .into_iter()
            .map(|(node, (slot, jobs))| {
                let route = node.map(|_| {
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                        slot,
                        SlotAddr::Master,
                    )))
                });
                (route, jobs)
            })
            .collect()
    }

    /// The hub for the releases of `record_key`: on the primary serving its slot (the map read
    /// again when stale), else on the first seed node that answers. `probe` is the channel its
    /// connection is checked with (see [`Hub::start`]).
    pub(crate) async fn hub_for(
        &self,
        conn: &Conn,
        record_key: &str,
        probe: &str,
        store: &str,
        timeout: Duration,
    ) -> Result<Arc<Hub>> {
        let slot = slot(record_key);
        let node_in =
            |map: Option<Arc<Vec<SlotRange>>>| map.and_then(|m| serving(&m, slot).cloned());
        let mut node = node_in(self.fresh_map());
        if node.is_none() {
            // Stale, or naming no primary for the slot (a failover): read again.
            self.read_map(conn, store, timeout).await;
            node = node_in(self.fresh_map());
        }
        let mut hubs = self.hubs.lock().await;
        if let Some((host, port)) = node {
            if let Some(h) = hubs.get(&(host.clone(), port)).filter(|h| !h.dead()) {
                return Ok(h.clone());
            }
            let started = match node_client(&self.node_url, Some((&host, port)), &self.certs) {
                Ok(client) => Hub::start(&client, probe, store, timeout).await,
                Err(e) => Err(map_err(store, e)),
            };
            match started {
                Ok(hub) => {
                    hubs.insert((host, port), hub.clone());
                    return Ok(hub);
                }
                Err(e) => {
                    // The map may be out of date (a failover): read it again next time.
                    tracing::debug!(store, node = %format!("{host}:{port}"), error = %e, "no pub/sub on the slot's primary; through a seed node");
                    *self.map.lock() = None;
                }
            }
        }
        // Any node hears every PUBLISH (through the cluster's bus).
        let mut failure = None;
        for (i, seed) in self.seeds.iter().enumerate() {
            let key = (format!("seed {i}"), 0);
            if let Some(h) = hubs.get(&key).filter(|h| !h.dead()) {
                return Ok(h.clone());
            }
            match Hub::start(seed, probe, store, timeout).await {
                Ok(hub) => {
                    hubs.insert(key, hub.clone());
                    return Ok(hub);
                }
                Err(e) => failure = Some(e),
            }
        }
        Err(failure.unwrap_or_else(|| Error::Unavailable {
            source: None,
            store: store.to_owned(),
            detail: "no node for pub/sub".into(),
        }))
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

/// The hash slot of a Redis key: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, if not empty) or of the whole key, modulo 16384.
pub(crate) fn slot(name: &str) -> u16 {
    let bytes = name.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(bytes) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Which primary serves each slot range, from `CLUSTER SLOTS`, asked at once of a node at random
/// and of the primary serving each of `ask_of` (one slot per primary of the last map read); the
/// first answer is taken. A node that does not answer (it hangs, or its connection is held up)
/// holds up no read but when asked alone. (The store's own `WAIT`s no longer hold up this
/// connection: they go on one of their own, [`Conn::waits`].)
///
/// Each is asked by a call routed to one node: the cluster connection's own fan-out
/// (`RoutingInfo::MultiNode`) queues its calls until something else wakes the connection.
async fn slot_map(
    conn: &ClusterConnection,
    store: &str,
    timeout: Duration,
    ask_of: &[u16],
) -> Result<Vec<SlotRange>> {
    let mut ask = ::redis::cmd("CLUSTER");
    ask.arg("SLOTS");
    let routes = ask_of
        .iter()
        .map(|&slot| SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master)))
        .chain([SingleNodeRoutingInfo::Random]);
    let asks = routes.map(|route| {
        let (mut conn, ask) = (conn.clone(), ask.clone());
        Box::pin(async move {
            conn.route_command(ask, RoutingInfo::SingleNode(route))
                .await
        })
    });
    let first = async { futures_util::future::select_ok(asks).await.map(|(v, _)| v) };
    let answer = bounded(store, timeout, "no CLUSTER SLOTS answer", first).await?;
    let slots: Vec<Vec<::redis::Value>> =
        ::redis::from_redis_value(answer).map_err(|e| Error::Store {
            source: None,
            store: store.to_owned(),
            detail: format!("unreadable CLUSTER SLOTS answer: {e}"),
            retryable: false,
        })?;
    let mut out = vec![];
    for range in slots {
        // [start, end, [host, port, id, …], replicas…]
        let int = |v: Option<&::redis::Value>| {
            v.and_then(|v| ::redis::from_redis_value_ref::<u16>(v).ok())
        };
        let node: Option<Node> = range
            .get(2)
            .and_then(|n| ::redis::from_redis_value_ref::<Vec<::redis::Value>>(n).ok())
            .and_then(|n| {
                let host = ::redis::from_redis_value_ref::<String>(n.first()?).ok()?;
                Some((host, int(n.get(1))?))
            });
        match (int(range.first()), int(range.get(1)), node) {
            (Some(start), Some(end), Some(node)) => out.push(SlotRange { start, end, node }),
            _ => {
                return Err(Error::Store {
                    source: None,
                    store: store.to_owned(),
                    detail: "unreadable CLUSTER SLOTS answer".into(),
                    retryable: false,
                })
            }
        }
    }
    Ok(out)
}

/// The cluster's primaries (`host`, `port`).
async fn primaries(conn: &ClusterConnection, store: &str, timeout: Duration) -> Result<Vec<Node>> {
    let mut out: Vec<Node> = vec![];
    for r in slot_map(conn, store, timeout, &[]).await? {
        if !out.contains(&r.node) {
            out.push(r.node);
        }
    }
    Ok(out)
}

/// The keys matching `pattern` on every primary (`SCAN` on each).
pub(crate) async fn scan_all(
    conn: &ClusterConnection,
    pattern: &str,
    store: &str,
    timeout: Duration,
) -> Result<Vec<String>> {
    let cluster = conn.clone();
    let mut names = vec![];
    for (host, port) in primaries(&cluster, store, timeout).await? {
        let on = &cluster;
        let host = &host;
        names.extend(
            scan(pattern, |page| async move {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                });
                let answer = bounded(
                    store,
                    timeout,
                    "no SCAN answer",
                    // An error reply is a value here: made an error.
                    async { on.clone().route_command(page, route).await?.extract_error() },
                )
                .await?;
                ::redis::from_redis_value(answer).map_err(|e| Error::Store {
                    source: None,
                    store: store.to_owned(),
                    detail: format!("unreadable SCAN answer: {e}"),
                    retryable: false,
                })
            })
            .await?,
        );
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::{parse, slot, RedisOptions};

    fn parse_url(url: &str, described: &str) -> crate::error::Result<super::ClusterUrl> {
        parse(RedisOptions::from_url(url)?, described)
    }

    #[test]
    fn slots_are_those_redis_computes() {
        // `CLUSTER KEYSLOT` of a Redis 7 server.
        assert_eq!(slot("leasehold:lock:{job}"), 2906);
        assert_eq!(slot("x{a}"), 15495);
        assert_eq!(slot("x{b}"), 3300);
        assert_eq!(slot("x{c}"), 7365);
        assert_eq!(slot("123456789"), 12739);
        // An empty tag: the whole key.
        assert_eq!(slot("a{}b"), 13694);
        assert_ne!(slot("lock:{}x}"), slot("fence:{}x}"));
    }

    #[test]
    fn cluster_urls() {
        let url = "rediss+cluster://u:p@h1:1,h2:2/0?prefix=a:lock:&ca=/ca.pem";
        let named = parse_url(url, "rediss+cluster://u:***@h1:1,h2:2/0").expect("good");
        assert_eq!(named.nodes, ["rediss://u:p@h1:1", "rediss://u:p@h2:2"]);
        assert_eq!(named.opts.prefix, "a:lock:");
        assert_eq!(named.checked.fence_prefix, "a:fence:");
        let named = parse_url("redis+cluster://h1:1", "redis+cluster://h1:1").expect("good");
        assert_eq!(named.nodes, ["redis://h1:1"]);
        for (url, says) in [
            ("redis+cluster://h1:1/2", "only database 0"),
            (
                "redis+cluster://h1:1?prefix=a{b}:",
                "may not contain { or }",
            ),
            (
                "redis+cluster://h1:1?fence_prefix=f{",
                "may not contain { or }",
            ),
            ("redis+cluster://h1", "bad server \"h1\""),
            (
                "redis+cluster://h1:1?bogus=1",
                "unknown parameter \"bogus\"",
            ),
        ] {
            let text = parse_url(url, url)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(text.contains(says), "{url}: {text}");
        }
    }

    #[test]
    fn keys_that_cannot_be_hash_tags_are_refused() {
        let key = |k: &str| crate::key::Key::new(k).expect("a key");
        assert!(super::check_key(&key("job")).is_ok());
        assert!(super::check_key(&key("a}")).is_ok());
        assert!(super::check_key(&key("}a")).is_err());
    }
}
