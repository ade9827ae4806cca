//! The `partition` and `lost-answer` faults of `leasehold torture`: each client reaches the store
//! through fault-injecting TCP proxies ([`TcpProxy`]), one set per client, so that one client (or
//! every client at once) can be cut off from the store while the others go on, or have the
//! store's answers lost ([`Link::Mute`], [`LostAnswers`]); and on an etcd cluster the run starts,
//! each member's peers reach it through a proxy of the harness ([`Peers`]), so that a member can
//! be partitioned from its peers.
//!
//! Every loopback address with a port in the store URL (`127.0.0.1:PORT`, `localhost:PORT`,
//! `[::1]:PORT`, in the host part or in a query parameter such as `endpoint=`) is rewritten to a
//! proxy's port on the same host. A proxy forwards bytes unchanged in the [`Link::Up`] state, and
//! otherwise as its [`Link`] says: slowed, answers lost, black-holed, or reset. A URL with no
//! loopback address (the file and memory stores, a remote server) cannot be partitioned, and nor
//! can Redis Sentinel and Redis Cluster URLs, whose clients learn other nodes' addresses from the
//! servers.
//!
//! etcd's members talk over connections dialed by both sides: a member reads its peer's messages
//! from a stream it dialed to that peer, and sends its own over streams the peer dialed to it (and
//! over requests it posts to the peer). Cutting the connections into one member's proxy therefore
//! cuts only half of its traffic. Each connection a peer proxy accepts answers to two links: its
//! member's, and that of the member which dialed it, found once per connection from the
//! accepted socket's remote port (the dialer's local port): the socket with that local port in
//! `/proc/net/tcp` (and `tcp6`), and the member process that holds its inode among its file
//! descriptors. Cutting a member sets its link: the connections into its proxy and those it
//! dialed into its peers' proxies.

pub(crate) use leasehold_servers::Link;
#[cfg(feature = "torture")]
use leasehold_servers::MemberPids;
use leasehold_servers::{Links, TcpProxy, TcpProxyOptions};
#[cfg(feature = "torture")]
use std::net::SocketAddr;
#[cfg(feature = "torture")]
use std::sync::Arc;
use std::time::Duration;

/// One client's way to the store: a proxy for each loopback address of its URL, all switched
/// together. Dropping it stops the proxies and ends their connections.
#[derive(Debug)]
pub(crate) struct Route {
    /// The store URL with each loopback address replaced by its proxy's.
    pub(crate) url: String,
    links: Links,
    _proxies: Vec<TcpProxy>,
}

/// Whether the store at `url` can be reached through the proxies of `fault`: an error saying
/// why not (see the module documentation).
pub(crate) fn proxiable(url: &str, fault: &str) -> Result<(), String> {
    let scheme = url.split("://").next().unwrap_or_default();
    if scheme.contains("+sentinel") || scheme.contains("+cluster") {
        return Err(format!(
            "{fault} cannot proxy {scheme}:// stores: their clients learn the other nodes' addresses from the servers and would go around the proxy"
        ));
    }
    if loopback_addresses(url).is_empty() {
        return Err(format!(
            "{fault} needs a store reached over TCP on this host (127.0.0.1:PORT, localhost:PORT or [::1]:PORT in the store URL); the file and memory stores have no network to cut"
        ));
    }
    Ok(())
}

impl Route {
    /// Starts the proxies for `url` (see the module documentation); a usage error, naming the
    /// `fault` that needs them, when the URL cannot be proxied.
    pub(crate) fn new(url: &str, fault: &str) -> Result<Route, String> {
        proxiable(url, fault)?;
        let links = Links::new(1);
        let mut proxies: Vec<((String, u16), TcpProxy)> = vec![];
        let mut rewritten = String::with_capacity(url.len());
        let mut copied = 0;
        for a in loopback_addresses(url) {
            let target = (a.host.clone(), a.port);
            let port = match proxies.iter().find(|(t, _)| *t == target) {
                Some((_, p)) => p.port,
                None => {
                    let options = TcpProxyOptions::new(&a.host, a.port).links(&links, 0);
                    let proxy =
                        TcpProxy::start_with(options).map_err(|e| format!("{fault}: {e}"))?;
                    let port = proxy.port;
                    proxies.push((target, proxy));
                    port
                }
            };
            rewritten.push_str(&url[copied..a.port_at]);
            rewritten.push_str(&port.to_string());
            copied = a.end;
        }
        rewritten.push_str(&url[copied..]);
        Ok(Route {
            url: rewritten,
            links,
            _proxies: proxies.into_iter().map(|(_, p)| p).collect(),
        })
    }

    /// Switches every proxy of this route to `link` (connections already open included).
    pub(crate) fn set(&self, link: Link) {
        self.links.set(0, link);
    }
}

/// Without the server launchers (the `torture` feature) no cluster is started here, so there are
/// never peers to cut.
#[cfg(not(feature = "torture"))]
#[derive(Debug)]
pub(crate) enum Peers {}

#[cfg(not(feature = "torture"))]
impl Peers {
    /// How many members the proxies front.
    pub(crate) fn members(&self) -> usize {
        match *self {}
    }

    /// Switches member `m`'s link.
    pub(crate) fn set(&self, _m: usize, _link: Link) {
        match *self {}
    }
}

/// The peer traffic of a cluster started here: a proxy in front of each member's peer port, which
/// the member advertises to its peers instead of its own (see the module documentation). Dropping
/// it (and its [aimer](Peers::aimer)) stops the proxies and ends their connections.
#[cfg(feature = "torture")]
#[derive(Debug)]
pub(crate) struct Peers {
    /// Each member's proxy port: the peer port it advertises.
    pub(crate) ports: Vec<u16>,
    /// The members' PIDs, kept up to date by the cluster.
    pub(crate) pids: MemberPids,
    proxies: Vec<Arc<TcpProxy>>,
    links: Links,
}

#[cfg(feature = "torture")]
impl Peers {
    /// How many members the proxies front.
    pub(crate) fn members(&self) -> usize {
        self.ports.len()
    }

    /// Starts a proxy for each of `members` members on a free loopback port, forwarding nowhere
    /// until [aimed](Peers::aimer); each connection also answers to the link of the member that
    /// dialed it.
    pub(crate) fn new(members: usize) -> Result<Peers, String> {
        let links = Links::new(members);
        let pids = MemberPids::new(members);
        let mut proxies = vec![];
        for m in 0..members {
            let dialers = pids.clone();
            let options = TcpProxyOptions::new("127.0.0.1", 0)
                .links(&links, m)
                .parties_of(move |from, to| {
                    dialer(from, to.port(), &dialers).into_iter().collect()
                });
            let proxy = TcpProxy::start_with(options).map_err(|e| format!("partition: {e}"))?;
            proxies.push(Arc::new(proxy));
        }
        Ok(Peers {
            ports: proxies.iter().map(|p| p.port).collect(),
            pids,
            proxies,
            links,
        })
    }

    /// What points the proxies at the members' own peer ports (by member), from any thread.
    pub(crate) fn aimer(&self) -> impl FnMut(&[u16]) + Send + 'static {
        let proxies = self.proxies.clone();
        move |ports: &[u16]| {
            for (proxy, port) in proxies.iter().zip(ports) {
                proxy.point_to(*port);
            }
        }
    }

    /// Switches member `m`'s link: the connections into its proxy and those it dialed into its
    /// peers' (connections already open included).
    pub(crate) fn set(&self, m: usize, link: Link) {
        self.links.set(m, link);
    }
}

/// A loopback address with a port, found in a URL.
#[derive(Debug, PartialEq, Eq)]
struct Address {
    /// The host to connect to: `127.0.0.1`, `localhost` or `::1`.
    host: String,
    port: u16,
    /// Where the port's digits start and end in the URL.
    port_at: usize,
    end: usize,
}

/// Every `127.0.0.1:PORT`, `localhost:PORT` and `[::1]:PORT` in `url`, the colon also
/// percent-encoded (`%3A`), in order.
fn loopback_addresses(url: &str) -> Vec<Address> {
    let lower = url.to_ascii_lowercase();
    let mut found = vec![];
    for (needle, host) in [
        ("127.0.0.1", "127.0.0.1"),
        ("localhost", "localhost"),
        ("[::1]", "::1"),
    ] {
        for (at, _) in lower.match_indices(needle) {
            let before = lower[..at].chars().next_back();
            let encoded = ["%2f", "%40", "%2c", "%3d"]
                .iter()
                .any(|e| lower[..at].ends_with(e));
            if !encoded && before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
            {
                continue;
            }
            let rest = &lower[at + needle.len()..];
            let colon = if rest.starts_with(':') {
                1
            } else if rest.starts_with("%3a") {
                3
            } else {
                continue;
            };
            let port_at = at + needle.len() + colon;
            let digits = lower[port_at..]
                .bytes()
                .take_while(u8::is_ascii_digit)
                .count();
            let end = port_at + digits;
            // A dotted name that only starts like the host (`127.0.0.10`, `localhost.example`)
            // is not it.
            if lower[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '.') {
                continue;
            }
            if let Ok(port) = lower[port_at..end].parse::<u16>() {
                found.push(Address {
                    host: host.to_owned(),
                    port,
                    port_at,
                    end,
                });
            }
        }
    }
    found.sort_by_key(|a| a.port_at);
    found
}

#[cfg(feature = "torture")]
/// The member (an index into `pids`) whose process dialed the connection from `from` to the
/// loopback port `to` that this process accepted, if it still has it open.
fn dialer(from: SocketAddr, to: u16, pids: &MemberPids) -> Option<usize> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .find_map(|table| socket_inode(&table, from.port(), to))?;
    let holds = format!("socket:[{inode}]");
    (0..pids.len()).find(|m| {
        pids.get(*m).is_some_and(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == holds.as_str())
                })
        })
    })
}

#[cfg(feature = "torture")]
/// The inode of the socket in a `/proc/net/tcp` (or `tcp6`) table whose local port is `local`
/// and remote port is `remote`.
fn socket_inode(table: &str, local: u16, remote: u16) -> Option<u64> {
    let port = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (l, r, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        if port(l)? != local || port(r)? != remote {
            return None;
        }
        inode.parse::<u64>().ok().filter(|i| *i != 0)
    })
}

/// Whom one injection of the fault cuts off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whom {
    /// One client, from the store.
    Client(usize),
    /// Every client, as if the store were cut off from everyone.
    Clients,
    /// A member of a cluster started here, from its peers (its clients still reach it).
    Member(usize),
}

impl std::fmt::Display for Whom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Whom::Client(c) => write!(f, "client {c} cut off from the store"),
            Whom::Clients => write!(f, "every client cut off from the store"),
            Whom::Member(m) => write!(f, "member m{m} cut from its peers"),
        }
    }
}

/// One injection of the fault: whom it cuts off, how, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cut {
    pub(crate) whom: Whom,
    pub(crate) link: Link,
    pub(crate) lasts: Duration,
}

impl Cut {
    /// A seeded choice for leases of `ttl`: with `members` members behind [`Peers`], a member
    /// one time in three; else (and always without) one of `clients` clients three times in four,
    /// else all; then added latency of TTL/3 for 1.5 TTL, a black hole for 1.5 TTL, or resets for
    /// TTL/2, each as likely.
    pub(crate) fn pick(
        rng: &mut fastrand::Rng,
        clients: usize,
        members: usize,
        ttl: Duration,
    ) -> Cut {
        let whom = if members > 0 && rng.u8(..3) == 0 {
            Whom::Member(rng.usize(..members))
        } else if rng.u8(..4) == 0 {
            Whom::Clients
        } else {
            Whom::Client(rng.usize(..clients.max(1)))
        };
        let (link, lasts) = match rng.u8(..3) {
            0 => (Link::Slow(ttl / 3), ttl * 3 / 2),
            1 => (Link::Hole, ttl * 3 / 2),
            _ => (Link::Reset, ttl / 2),
        };
        Cut { whom, link, lasts }
    }

    /// Cuts `routes` or a member of `peers` as chosen, waits until it is over, and lets them up
    /// again.
    pub(crate) async fn apply(&self, routes: &[Route], peers: Option<&Peers>) {
        let set = |link: Link| match self.whom {
            Whom::Member(m) => {
                if let Some(p) = peers {
                    p.set(m, link);
                }
            }
            Whom::Client(c) => {
                if let Some(r) = routes.get(c) {
                    r.set(link);
                }
            }
            Whom::Clients => routes.iter().for_each(|r| r.set(link)),
        };
        set(self.link);
        tokio::time::sleep(self.lasts).await;
        set(Link::Up);
    }
}

/// One injection of the `lost-answer` fault: whose answers the store's proxies swallow and for
/// how long, and for how long the first of them to enter a critical section after the resets is
/// then cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LostAnswers {
    /// The clients whose answers are lost.
    pub(crate) muted: Vec<usize>,
    /// How long the answers stay lost once the holders have left their sections: the clients'
    /// store timeout and 0.3 TTL more. A grant made to a waiter polling within a third of a TTL
    /// of the leaving is then sent again, after the resets, 0.3 TTL to the timeout and 0.3 TTL
    /// later than it was first: a holder of a lease counted from the first request would have
    /// it expire on the store 0.4 to 0.7 TTL before its own `valid_until`, past the loss grace.
    pub(crate) after_leaving: Duration,
    /// How long the first of them to enter a critical section after the resets is black-holed.
    pub(crate) cut: Duration,
}

impl LostAnswers {
    /// A seeded choice among `clients` clients, of which `waiting` are inside no critical section
    /// (those whose next grant can be the one whose answer is lost), for clients whose store
    /// calls time out after `timeout`, with leases of `ttl`: every client one time in two, else
    /// every waiting client (every client when none waits); their answers lost until `timeout`
    /// and 0.3 TTL after the holders left, the first of them to enter then cut off for 1.5 TTL.
    pub(crate) fn pick(
        rng: &mut fastrand::Rng,
        clients: usize,
        waiting: &[usize],
        timeout: Duration,
        ttl: Duration,
    ) -> LostAnswers {
        let muted = if rng.bool() || waiting.is_empty() {
            (0..clients).collect()
        } else {
            waiting.to_vec()
        };
        LostAnswers {
            muted,
            after_leaving: timeout + ttl.mul_f64(0.3),
            cut: ttl * 3 / 2,
        }
    }

    /// Switches the muted clients' routes to `link`: [`Link::Mute`], then [`Link::Up`] (which
    /// resets the connections that were muted).
    pub(crate) fn set(&self, routes: &[Route], link: Link) {
        for r in self.muted.iter().filter_map(|c| routes.get(*c)) {
            r.set(link);
        }
    }

    /// Black-holes `routes[client]` for the time chosen, then lets it up again.
    pub(crate) async fn cut_off(&self, routes: &[Route], client: usize) {
        if let Some(r) = routes.get(client) {
            r.set(Link::Hole);
            tokio::time::sleep(self.cut).await;
            r.set(Link::Up);
        }
    }
}

/// The value of the `timeout=` parameter of a store URL (the store's per-call timeout), if it
/// has one; an error when it is not a duration.
pub(crate) fn url_timeout(url: &str) -> Result<Option<Duration>, String> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(None);
    };
    query
        .rsplit('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "timeout")
        .map(|(_, v)| {
            crate::cli::parse_duration(v).map_err(|e| format!("the store URL's timeout={v}: {e}"))
        })
        .transpose()
}

/// `url` with `timeout=` set to `timeout` when it sets none, and the per-call timeout its
/// clients then have.
pub(crate) fn with_timeout(url: &str, timeout: Duration) -> Result<(String, Duration), String> {
    if let Some(t) = url_timeout(url)? {
        return Ok((url.to_owned(), t));
    }
    let ms = timeout.as_millis().max(1);
    let sep = if url.contains('?') { '&' } else { '?' };
    Ok((
        format!("{url}{sep}timeout={ms}ms"),
        Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loopback_address_of_a_url_is_found_and_nothing_else() {
        let ports = |url: &str| {
            loopback_addresses(url)
                .into_iter()
                .map(|a| (a.host, a.port))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ports("redis://:secret@127.0.0.1:6379/0"),
            [("127.0.0.1".to_owned(), 6379)]
        );
        assert_eq!(
            ports("gs://b/p?endpoint=http://localhost:4443&timeout=1s"),
            [("localhost".to_owned(), 4443)]
        );
        assert_eq!(
            ports("redlock://127.0.0.1:1,[::1]:2,LOCALHOST:3"),
            [
                ("127.0.0.1".to_owned(), 1),
                ("::1".to_owned(), 2),
                ("localhost".to_owned(), 3)
            ]
        );
        assert_eq!(
            ports("s3://b/p?endpoint=http%3A%2F%2F127.0.0.1%3A9000"),
            [("127.0.0.1".to_owned(), 9000)]
        );
        for none in [
            "file:///tmp/locks",
            "memory://",
            "redis://127.0.0.10:1",
            "redis://my-localhost:1",
            "redis://localhost.example:1",
            "redis://10.0.0.1:6379",
        ] {
            assert_eq!(ports(none), [], "{none}");
        }
    }

    #[test]
    fn a_route_rewrites_each_address_to_one_proxy_and_refuses_what_it_cannot_cut() {
        let r = Route::new(
            "redlock://127.0.0.1:7001,localhost:7002,127.0.0.1:7001",
            "partition",
        )
        .unwrap();
        let ports: Vec<u16> = loopback_addresses(&r.url).iter().map(|a| a.port).collect();
        assert_eq!(ports.len(), 3);
        assert_eq!(ports[0], ports[2]);
        assert!(ports[0] != 7001 && ports[1] != 7002 && ports[0] != ports[1]);
        for refused in [
            "file:///tmp/x",
            "memory://",
            "redis+sentinel://127.0.0.1:26379/m",
            "redis+cluster://127.0.0.1:7000",
        ] {
            assert!(Route::new(refused, "partition").is_err(), "{refused}");
        }
    }

    #[test]
    fn lost_answers_give_the_clients_a_timeout_below_the_ttl_unless_their_url_has_one() {
        let ms = Duration::from_millis;
        assert_eq!(
            with_timeout("redis://127.0.0.1:1/0", ms(400)).unwrap(),
            ("redis://127.0.0.1:1/0?timeout=400ms".to_owned(), ms(400))
        );
        assert_eq!(
            with_timeout("gs://b/p?endpoint=http://127.0.0.1:2", ms(400)).unwrap(),
            (
                "gs://b/p?endpoint=http://127.0.0.1:2&timeout=400ms".to_owned(),
                ms(400)
            )
        );
        // The URL's own timeout is kept; `replicas_timeout` is another parameter.
        let url = "redis://127.0.0.1:1/0?replicas_timeout=1s&timeout=3s";
        assert_eq!(
            with_timeout(url, ms(400)).unwrap(),
            (url.to_owned(), Duration::from_secs(3))
        );
        assert_eq!(
            url_timeout("redis://127.0.0.1:1/0?replicas_timeout=1s").unwrap(),
            None
        );
        assert!(url_timeout("redis://127.0.0.1:1/0?timeout=soon").is_err());
    }

    #[test]
    fn lost_answers_are_every_clients_or_the_waiting_ones() {
        let ttl = Duration::from_secs(1);
        let timeout = Duration::from_millis(400);
        let mut rng = fastrand::Rng::with_seed(7);
        let (mut all, mut waiting) = (0, 0);
        for _ in 0..100 {
            let lost = LostAnswers::pick(&mut rng, 5, &[1, 3], timeout, ttl);
            assert_eq!(lost.after_leaving, Duration::from_millis(700));
            assert_eq!(lost.cut, Duration::from_millis(1500));
            match lost.muted.as_slice() {
                [0, 1, 2, 3, 4] => all += 1,
                [1, 3] => waiting += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(all > 20 && waiting > 20, "{all} {waiting}");
        // Nobody waiting: every client.
        let lost = LostAnswers::pick(&mut rng, 3, &[], timeout, ttl);
        assert_eq!(lost.muted, [0, 1, 2]);
    }

    #[test]
    #[cfg(feature = "torture")]
    fn the_dialer_of_an_accepted_connection_is_found_by_its_socket() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap().port();
        let dialed = std::net::TcpStream::connect(("127.0.0.1", to)).unwrap();
        let (_accepted, from) = listener.accept().unwrap();
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let inode = socket_inode(&table, from.port(), to).unwrap();
        let held = std::fs::read_link(format!("/proc/self/fd/{}", dialed.as_raw_fd())).unwrap();
        assert_eq!(held.to_str(), Some(format!("socket:[{inode}]").as_str()));
        // The accepted end (local port `to`) is not taken for the dialer's.
        assert_ne!(socket_inode(&table, to, from.port()), Some(inode));
        assert_eq!(socket_inode("header\n", from.port(), to), None);
    }

    /// `POST path` with a JSON body to the etcd member with client port `port` (the JSON
    /// gateway), from a blocking thread: its status and JSON answer, if it answers in 10 s.
    async fn etcd(port: u16, path: &'static str, body: &'static str) -> Option<(u16, Value)> {
        tokio::task::spawn_blocking(move || {
            let (code, body) = leasehold_testkit::servers::http_request(
                port,
                "POST",
                path,
                &[("Content-Type", "application/json")],
                body,
            )?;
            Some((code, serde_json::from_str(&body).unwrap_or_default()))
        })
        .await
        .unwrap()
    }

    use serde_json::Value;

    /// A member's view: (its ID, the leader it follows (0: none), the Raft term).
    async fn status(port: u16) -> Option<(u64, u64, u64)> {
        let n = |v: &Value| v.as_u64().or_else(|| v.as_str()?.parse().ok());
        let (code, s) = etcd(port, "/v3/maintenance/status", "{}").await?;
        (code == 200).then_some(())?;
        Some((
            n(&s["header"]["member_id"])?,
            n(&s["leader"]).unwrap_or(0),
            n(&s["raftTerm"])?,
        ))
    }

    /// Polls `check` every 50 ms until it gives a value, for at most `limit`.
    async fn until<T, F: std::future::Future<Output = Option<T>>>(
        what: &str,
        limit: Duration,
        mut check: impl FnMut() -> F,
    ) -> T {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The members' views, if every one answers.
    async fn views(ports: &[u16]) -> Option<Vec<(u64, u64, u64)>> {
        let mut all = vec![];
        for p in ports {
            all.push(status(*p).await?);
        }
        Some(all)
    }

    #[cfg(feature = "torture")]
    #[tokio::test]
    async fn a_member_cut_from_its_peers_is_isolated_until_the_cut_lifts() {
        use leasehold_testkit::etcd_cluster::EtcdCluster;
        let peers = Peers::new(3).unwrap();
        let (proxies, pids, aim) = (peers.ports.clone(), peers.pids.clone(), peers.aimer());
        let cluster = tokio::task::spawn_blocking(move || {
            EtcdCluster::start_with_peer_proxies(&proxies, &pids, aim)
        })
        .await
        .unwrap();
        let ports = cluster.ports.clone();
        assert_eq!(cluster.advertised_peer_ports(), peers.ports);
        // Every member knows the others by their proxies' URLs.
        let (_, members) = etcd(ports[0], "/v3/cluster/member/list", "{}")
            .await
            .unwrap();
        let urls = members.to_string();
        for (proxy, own) in peers.ports.iter().zip(cluster.peer_ports()) {
            assert!(urls.contains(&format!("127.0.0.1:{proxy}")), "{urls}");
            assert!(!urls.contains(&format!("127.0.0.1:{own}\"")), "{urls}");
        }
        // All three agree on a leader.
        let before = until("a leader all agree on", Duration::from_secs(20), || async {
            let v = views(&ports).await?;
            (v[0].1 != 0 && v.iter().all(|s| s.1 == v[0].1)).then_some(v)
        })
        .await;
        let (old_id, old_term) = (before[0].1, before[0].2);
        let old = before.iter().position(|s| s.0 == old_id).unwrap();
        let others: Vec<u16> = (0..3).filter(|i| *i != old).map(|i| ports[i]).collect();

        // Cut the leader from its peers: the other two elect one of themselves.
        let cut = tokio::time::Instant::now();
        peers.set(old, Link::Hole);
        let new_id = until(
            "a new leader of the majority",
            Duration::from_secs(20),
            || async {
                let v = views(&others).await?;
                (v[0].1 != 0
                    && v[0].1 != old_id
                    && v.iter().all(|s| s.1 == v[0].1 && s.2 > old_term))
                .then_some(v[0].1)
            },
        )
        .await;
        crate::output::errln!(
            "leader {old_id:x} (m{old}, term {old_term}) cut; new leader {new_id:x} after {:?}",
            cut.elapsed()
        );
        let (_, alone, _) = status(ports[old]).await.unwrap();
        crate::output::errln!("the cut member follows {alone:x}");
        assert_ne!(alone, new_id, "the cut member heard of the new leader");
        // A write through the majority succeeds; one through the cut member does not.
        // key "partition", values "majority" and "isolated", in base64.
        let put_majority = r#"{"key":"cGFydGl0aW9u","value":"bWFqb3JpdHk="}"#;
        until(
            "a write through the majority",
            Duration::from_secs(20),
            || async {
                let (code, _) = etcd(others[0], "/v3/kv/put", put_majority).await?;
                (code == 200).then_some(())
            },
        )
        .await;
        let put_isolated = r#"{"key":"cGFydGl0aW9u","value":"aXNvbGF0ZWQ="}"#;
        let t = tokio::time::Instant::now();
        let isolated = etcd(ports[old], "/v3/kv/put", put_isolated).await;
        crate::output::errln!(
            "the write through the cut member: {isolated:?} after {:?}",
            t.elapsed()
        );
        assert!(
            isolated.as_ref().is_none_or(|(code, _)| *code != 200),
            "a write through the cut member succeeded: {isolated:?}"
        );

        // Lift the cut: the old leader rejoins, all three follow one leader at one term, and it
        // reads the majority's write. (Usually the new leader; but a member that campaigned
        // alone while cut off may come back at a higher term and force one more election,
        // which any member may win: Raft without pre-vote.)
        let healed = tokio::time::Instant::now();
        peers.set(old, Link::Up);
        until(
            "the old leader following the cluster's leader",
            Duration::from_secs(20),
            || async {
                let v = views(&ports).await?;
                (v[0].1 != 0 && v.iter().all(|s| s.1 == v[0].1 && s.2 == v[0].2)).then_some(())
            },
        )
        .await;
        crate::output::errln!("rejoined as a follower after {:?}", healed.elapsed());
        let read = until(
            "a read through the old leader",
            Duration::from_secs(20),
            || async {
                let (code, body) =
                    etcd(ports[old], "/v3/kv/range", r#"{"key":"cGFydGl0aW9u"}"#).await?;
                (code == 200).then_some(body)
            },
        )
        .await;
        assert_eq!(read["kvs"][0]["value"], "bWFqb3JpdHk=", "{read}");
        drop(cluster);
    }
}
