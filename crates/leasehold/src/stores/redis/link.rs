//! The link: the store's command connection, replaced when its server stops being the primary
//! (a failover behind Sentinel, a name that moved, a cluster that hangs) or when a connection could
//! not be made and now can. Every call goes through [`Link::send`], bounded by the store's
//! timeout. Where to connect next it asks the sentinels ([`Sentinels`]) or the cluster's nodes
//! (`cluster.rs`), which sit below it.

#[cfg(feature = "redis-cluster")]
use super::cluster::ClusterNodes;
use super::conn::Conn;
use super::error::{connection_refused, map_err, read_only};
use super::sentinel::Sentinels;
use crate::error::{Error, Result};
use ::redis::aio::ConnectionManagerConfig;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Where the store finds its server.
pub(crate) enum Origin {
    /// One address (a name that may move to another server: DNS, a proxy, a managed endpoint).
    Fixed,
    /// Sentinels that name the primary of a master group (`redis+sentinel://`).
    Sentinel(Sentinels),
    /// A Redis Cluster (`redis+cluster://`): the connection routes each call to the node serving
    /// its key's slot and follows the cluster's moves itself; pub/sub goes to that node too.
    #[cfg(feature = "redis-cluster")]
    Cluster(ClusterNodes),
}

/// The store's command connection, replaced when its server stops being the primary.
///
/// After a failover (Sentinel, a managed service) the old primary is often still up, demoted to a
/// replica, and answers every write with `READONLY`. The connection manager reconnects only when a
/// connection breaks, and always to the same address, so the link replaces it: on `READONLY` at
/// once (for a fixed address, connecting again resolves the name again; under Sentinel, to the
/// primary the sentinels name), and under Sentinel also when the server is unreachable and the
/// sentinels name another primary.
pub(super) struct Link {
    pub(super) origin: Origin,
    config: ConnectionManagerConfig,
    /// The store's URL without its secrets, naming it in errors and the log.
    pub(super) described: String,
    /// The store's per-call timeout.
    pub(super) timeout: Duration,
    /// The connection and its generation (so that calls failing together replace it once).
    pub(super) current: Mutex<(u64, Conn)>,
    /// Whether the connection has a second one for calls that wait for replicas ([`Conn::waits`]).
    waits: bool,
    /// The client the connection was made from (the pub/sub connection is made from it too).
    pub(super) client: Mutex<::redis::Client>,
    /// A sentinel lookup, or a new cluster connection, is under way (one at a time).
    looking_up: std::sync::atomic::AtomicBool,
    /// A call is trying a new connection after one could not be made ([`Link::connect_anew`]).
    connecting_anew: std::sync::atomic::AtomicBool,
    /// When a call that ran out of time last started a new connection ([`Link::timed_out`]).
    reconnected: Mutex<Option<std::time::Instant>>,
}

/// Clears a flag however the work it marks ends (its call dropped, say).
struct Cleared<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Cleared<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The least time between two new connections made because calls ran out of time.
const RECONNECT_GAP: Duration = Duration::from_secs(1);

impl Link {
    /// A link over `conn`, made from `client` with `config` (and a second connection for calls
    /// that wait for replicas when `waits`), to the server `origin` finds.
    pub(super) fn new(
        origin: Origin,
        (conn, client, config): (Conn, ::redis::Client, ConnectionManagerConfig),
        described: String,
        timeout: Duration,
        waits: bool,
    ) -> Self {
        Link {
            origin,
            config,
            described,
            timeout,
            current: Mutex::new((0, conn)),
            waits,
            client: Mutex::new(client),
            looking_up: Default::default(),
            connecting_anew: Default::default(),
            reconnected: Mutex::new(None),
        }
    }

    /// Sends what `call` sends on a clone of the connection, bounded by the store's timeout. A
    /// `READONLY` answer is a retryable [`Error::Unavailable`] that replaces the connection.
    ///
    /// A connection that could not be made for a reason other than I/O (the server answered
    /// something that is not Redis, or refused the credentials) is kept by the connection manager,
    /// which connects again only after an I/O error: every later call would get that error, even
    /// once the server is back on its port or accepts the credentials. So such a failure is
    /// checked with one new connection attempt, made by the call (one call at a time; the others
    /// answer the error at once): when it connects, the link takes a new connection and the call
    /// is sent on it; when not, the call answers the error, which is current. On a cluster, whose
    /// connection says only "no connections found" when it could not connect to a node, the call
    /// answers the refusal behind that instead, when the nodes refuse the connection
    /// ([`Link::cluster_refusal`]).
    pub(super) async fn send<T, F>(self: &Arc<Self>, call: impl Fn(Conn) -> F) -> Result<T>
    where
        F: std::future::Future<Output = ::redis::RedisResult<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let (generation, conn) = self.current.lock().clone();
        let mut answer = tokio::time::timeout_at(deadline, call(conn)).await;
        let mut on = generation;
        if let Ok(Err(e)) = &answer {
            if connection_refused(e) && self.connect_anew(generation, deadline).await {
                let (generation, conn) = self.current.lock().clone();
                on = generation;
                answer = tokio::time::timeout_at(deadline, call(conn)).await;
            }
        }
        #[cfg(feature = "redis-cluster")]
        if let Ok(Err(e)) = &answer {
            if e.kind() == ::redis::ErrorKind::ClusterConnectionNotFound {
                if let Some(refused) = self.cluster_refusal(deadline).await {
                    answer = Ok(Err(refused));
                }
            }
        }
        let e = match answer {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !e.is_timeout() => e,
            // Out of time: the call's bound, or the connection's own (to connect; the cluster
            // connection's response timeout).
            _ => {
                self.timed_out(on);
                return Err(Error::no_answer(self.described.clone()));
            }
        };
        let demoted = read_only(&e);
        let err = map_err(&self.described, e);
        if demoted || matches!(err, Error::Unavailable { .. }) {
            self.replace(on, demoted);
        }
        Err(err)
    }

    /// After a call on connection `generation` found that it could not be made
    /// ([`connection_refused`]): tries one new connection (to the primary the sentinels name,
    /// under Sentinel) before `deadline`, unless another call is trying already; on success the
    /// link takes a new connection. Whether it did (or another call replaced the connection
    /// meanwhile): the call is then worth sending again.
    async fn connect_anew(
        self: &Arc<Self>,
        generation: u64,
        deadline: tokio::time::Instant,
    ) -> bool {
        // The cluster connection makes its nodes' connections itself.
        if self.clustered()
            || self
                .connecting_anew
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return false;
        }
        let _done = Cleared(&self.connecting_anew);
        if self.current.lock().0 != generation {
            return true;
        }
        let attempt = async {
            let client = match &self.origin {
                Origin::Sentinel(sentinels) => sentinels
                    .primary(&self.described, self.timeout)
                    .await
                    .ok()?,
                _ => self.client.lock().clone(),
            };
            // One attempt: the connection manager's own retries would outlast the call.
            let config = ::redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(None);
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok()?;
            Some(client)
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Some(client)) => self.install(
                generation,
                client,
                "a connection could not be made before, and can now",
            ),
            _ => false,
        }
    }

    /// After a call to a cluster found no connection to send on: why, when the nodes refuse
    /// connections ([`ClusterNodes::refusal`]), checked by one call at a
    /// time before `deadline` (the others answer their own error).
    #[cfg(feature = "redis-cluster")]
    async fn cluster_refusal(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Option<::redis::RedisError> {
        let Origin::Cluster(nodes) = &self.origin else {
            return None;
        };
        if self
            .connecting_anew
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let _done = Cleared(&self.connecting_anew);
        tokio::time::timeout_at(deadline, nodes.refusal(self.timeout))
            .await
            .ok()
            .flatten()
    }

    /// After a call on connection `generation` ran out of time. A server that hangs (stopped, or
    /// behind a partition that drops packets) gives the connection no error to reconnect on, and
    /// calls would run out of time for as long as it hangs, even after a failover had replaced it.
    /// So a new connection is made (at most one a second): through a name that has moved (DNS, a
    /// proxy, a managed endpoint) it reaches the new server; on a cluster it reads the slot map
    /// afresh from the nodes that answer; under Sentinel the sentinels are asked, as on any error.
    fn timed_out(self: &Arc<Self>, generation: u64) {
        if matches!(self.origin, Origin::Sentinel(_)) {
            return self.replace(generation, false);
        }
        if self.current.lock().0 != generation {
            // Replaced already (a call that was in flight on the old connection).
            return;
        }
        {
            let mut last = self.reconnected.lock();
            if last.is_some_and(|t| t.elapsed() < RECONNECT_GAP) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        #[cfg(feature = "redis-cluster")]
        if matches!(self.origin, Origin::Cluster(_)) {
            return self.one_at_a_time(move |link| async move {
                if let Origin::Cluster(nodes) = &link.origin {
                    let (described, timeout) = (&link.described, link.timeout);
                    if let Some(conn) = nodes.reconnect(described, timeout, link.waits).await {
                        link.put(generation, conn, None, "calls ran out of time");
                    }
                }
            });
        }
        let client = self.client.lock().clone();
        self.install(generation, client, "calls ran out of time");
    }

    /// After connection `generation` failed: replaces it if its server was `demoted`, or, under
    /// Sentinel, if the sentinels name another primary (looked up in the background). The
    /// cluster connection follows the failovers it hears of (`MOVED`, `READONLY`, a dropped
    /// connection) itself.
    fn replace(self: &Arc<Self>, generation: u64, demoted: bool) {
        #[cfg(feature = "redis-cluster")]
        if matches!(self.origin, Origin::Cluster(_)) {
            return;
        }
        if !matches!(self.origin, Origin::Sentinel(_)) {
            if demoted {
                let client = self.client.lock().clone();
                self.install(generation, client, "the server is no longer the primary");
            }
            return;
        }
        self.one_at_a_time(move |link| async move {
            let Origin::Sentinel(sentinels) = &link.origin else {
                return;
            };
            match sentinels.primary(&link.described, link.timeout).await {
                Ok(client) if demoted => {
                    link.install(generation, client, "the server is no longer the primary");
                }
                Ok(client) => link.switch_to(generation, client),
                Err(e) => {
                    tracing::warn!(store = %link.described, error = %e, "sentinel lookup failed")
                }
            }
        });
    }

    /// Runs `work` in the background, unless a sentinel lookup or a new cluster connection is
    /// under way already (one at a time).
    fn one_at_a_time<F, Fut>(self: &Arc<Self>, work: F)
    where
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        /// Clears the flag however the work ends (a panic, a runtime shutting down).
        struct Done(Arc<Link>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0
                    .looking_up
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
        }
        if self
            .looking_up
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let done = Done(self.clone());
        tokio::spawn(async move {
            work(done.0.clone()).await;
            drop(done);
        });
    }

    /// Whether the link is to a Redis Cluster.
    pub(super) fn clustered(&self) -> bool {
        #[cfg(feature = "redis-cluster")]
        if matches!(self.origin, Origin::Cluster(_)) {
            return true;
        }
        false
    }

    /// Moves the link to `client`, the primary a sentinel announced ([`Sentinels::follow`]),
    /// unless it is on that server already.
    pub(super) fn follow_switch(&self, client: ::redis::Client) {
        let generation = self.current.lock().0;
        self.switch_to(generation, client)
    }

    /// Moves connection `generation` to `client` (the primary the sentinels name) unless the link
    /// is on that server already.
    fn switch_to(&self, generation: u64, client: ::redis::Client) {
        if client.get_connection_info().addr() != self.client.lock().get_connection_info().addr() {
            self.install(generation, client, "the sentinels name another primary");
        }
    }

    /// Makes `conn` (made from `client`, when that changes too) the link's connection if
    /// `generation` is still current (`why`: for the log). Both change under the connection's
    /// lock, so whoever reads a generation reads its client.
    fn put(&self, generation: u64, conn: Conn, client: Option<::redis::Client>, why: &str) -> bool {
        let mut current = self.current.lock();
        if current.0 != generation {
            return false;
        }
        tracing::warn!(store = %self.described, "{why}; connecting again");
        *current = (generation + 1, conn);
        if let Some(client) = client {
            *self.client.lock() = client;
        }
        true
    }

    /// Makes `client` the link's, with a new connection (made on first use) if `generation` is
    /// still current (`why`: for the log).
    fn install(&self, generation: u64, client: ::redis::Client, why: &str) -> bool {
        if self.current.lock().0 != generation {
            return false;
        }
        match Conn::lazy(&client, &self.config, self.waits) {
            Ok(fresh) => self.put(generation, fresh, Some(client), why),
            Err(e) => {
                tracing::warn!(store = %self.described, error = %e, "cannot replace the connection");
                false
            }
        }
    }
}
