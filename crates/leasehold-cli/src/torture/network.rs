//! The `partition` fault of `leasehold torture`: each client reaches the store through TCP
//! proxies of the harness, one set per client, so that one client (or every client at once) can
//! be cut off from the store while the others go on.
//!
//! Every loopback address with a port in the store URL (`127.0.0.1:PORT`, `localhost:PORT`,
//! `[::1]:PORT`, in the host part or in a query parameter such as `endpoint=`) is rewritten to a
//! proxy's port on the same host. A proxy forwards bytes unchanged in the [`Link::Up`] state, and
//! otherwise as its [`Link`] says: slowed, black-holed, or reset. A URL with no loopback address
//! (the file and memory stores, a remote server) cannot be partitioned, and nor can Redis Sentinel
//! and Redis Cluster URLs, whose clients learn other nodes' addresses from the servers.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a client's proxies do with the bytes between it and the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    /// Bytes pass as they come.
    Up,
    /// Each chunk, either way, is held this long before it is passed on (added latency).
    Slow(Duration),
    /// Nothing passes either way, and nothing is closed: what is read is held until the link is
    /// up again (a black hole: a partition that neither side sees as such).
    Hole,
    /// Every connection is closed with a reset (RST), and new ones are reset as they come.
    Reset,
}

/// One client's way to the store: a proxy for each loopback address of its URL, all switched
/// together. Dropping it stops the proxies and ends their connections.
#[derive(Debug)]
pub(crate) struct Route {
    /// The store URL with each loopback address replaced by its proxy's.
    pub(crate) url: String,
    link: watch::Sender<Link>,
    accepting: Vec<JoinHandle<()>>,
}

impl Route {
    /// Starts the proxies for `url` (see the module documentation); a usage error when the URL
    /// cannot be partitioned.
    pub(crate) async fn new(url: &str) -> Result<Route, String> {
        let scheme = url.split("://").next().unwrap_or_default();
        if scheme.contains("+sentinel") || scheme.contains("+cluster") {
            return Err(format!(
                "partition cannot proxy {scheme}:// stores: their clients learn the other nodes' addresses from the servers and would go around the proxy"
            ));
        }
        let found = loopback_addresses(url);
        if found.is_empty() {
            return Err(
                "partition needs a store reached over TCP on this host (127.0.0.1:PORT, localhost:PORT or [::1]:PORT in the store URL); the file and memory stores have no network to cut"
                    .into(),
            );
        }
        let (link, _) = watch::channel(Link::Up);
        let mut proxies: Vec<((String, u16), u16)> = vec![];
        let mut accepting = vec![];
        let mut rewritten = String::with_capacity(url.len());
        let mut copied = 0;
        for a in found {
            let target = (a.host.clone(), a.port);
            let port = match proxies.iter().find(|(t, _)| *t == target) {
                Some((_, p)) => *p,
                None => {
                    let (port, task) = proxy(&a.host, a.port, link.subscribe()).await?;
                    proxies.push((target, port));
                    accepting.push(task);
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
            link,
            accepting,
        })
    }

    /// Switches every proxy of this route to `link` (connections already open included).
    pub(crate) fn set(&self, link: Link) {
        self.link.send_replace(link);
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        for task in &self.accepting {
            task.abort();
        }
        // The connections' tasks end when the sender goes with this route.
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

/// Starts a proxy to `host:port` on a free port of the same loopback host: that port, and the
/// task accepting its connections.
async fn proxy(
    host: &str,
    port: u16,
    link: watch::Receiver<Link>,
) -> Result<(u16, JoinHandle<()>), String> {
    let listen = if host == "::1" {
        "[::1]:0"
    } else {
        "127.0.0.1:0"
    };
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("partition: cannot listen on {listen}: {e}"))?;
    let mine = listener
        .local_addr()
        .map_err(|e| format!("partition: {e}"))?
        .port();
    let host = host.to_owned();
    let task = tokio::spawn(async move {
        loop {
            let client = match listener.accept().await {
                Ok((c, _)) => c,
                Err(_) => {
                    // Out of descriptors, most likely: try again shortly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if *link.borrow() == Link::Reset {
                reset(client);
                continue;
            }
            let (host, link) = (host.clone(), link.clone());
            tokio::spawn(async move {
                match TcpStream::connect((host.as_str(), port)).await {
                    Ok(server) => forward(client, server, link).await,
                    Err(_) => reset(client),
                }
            });
        }
    });
    Ok((mine, task))
}

/// Closes `stream` with a reset (RST) rather than a FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Passes bytes between `a` and `b` as `link` says, until either closes, the link resets, or the
/// route is dropped.
async fn forward(mut a: TcpStream, mut b: TcpStream, mut link: watch::Receiver<Link>) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    let mut from_a = vec![0u8; 16 * 1024];
    let mut from_b = vec![0u8; 16 * 1024];
    loop {
        let now = *link.borrow_and_update();
        match now {
            Link::Reset => {
                reset(a);
                reset(b);
                return;
            }
            Link::Hole => {
                // Nothing is read: the kernel's buffers fill, the peers wait.
                if link.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Link::Up | Link::Slow(_) => {}
        }
        let (n, a_to_b) = tokio::select! {
            changed = link.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
            read = a.read(&mut from_a) => match read {
                Ok(n) if n > 0 => (n, true),
                _ => return,
            },
            read = b.read(&mut from_b) => match read {
                Ok(n) if n > 0 => (n, false),
                _ => return,
            },
        };
        // The chunk goes as the link is now: held through a black hole, dropped with a reset.
        loop {
            let now = *link.borrow_and_update();
            match now {
                Link::Up => break,
                Link::Slow(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Link::Hole => {
                    if link.changed().await.is_err() {
                        return;
                    }
                }
                Link::Reset => {
                    reset(a);
                    reset(b);
                    return;
                }
            }
        }
        let written = if a_to_b {
            b.write_all(&from_a[..n]).await
        } else {
            a.write_all(&from_b[..n]).await
        };
        if written.is_err() {
            return;
        }
    }
}

/// One injection of the fault: whom it cuts off (`None`: every client, as if the store were cut
/// off from everyone), how, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cut {
    pub(crate) whom: Option<usize>,
    pub(crate) link: Link,
    pub(crate) lasts: Duration,
}

impl Cut {
    /// A seeded choice among `clients` clients for leases of `ttl`: one client three times in
    /// four, else all; then added latency of TTL/3 for 1.5 TTL, a black hole for 1.5 TTL, or
    /// resets for TTL/2, each as likely.
    pub(crate) fn pick(rng: &mut fastrand::Rng, clients: usize, ttl: Duration) -> Cut {
        let whom = if rng.u8(..4) == 0 {
            None
        } else {
            Some(rng.usize(..clients.max(1)))
        };
        let (link, lasts) = match rng.u8(..3) {
            0 => (Link::Slow(ttl / 3), ttl * 3 / 2),
            1 => (Link::Hole, ttl * 3 / 2),
            _ => (Link::Reset, ttl / 2),
        };
        Cut { whom, link, lasts }
    }

    /// Cuts `routes` as chosen, waits until it is over, and lets them up again.
    pub(crate) async fn apply(&self, routes: &[Route]) {
        let chosen = || {
            routes
                .iter()
                .enumerate()
                .filter(|(i, _)| self.whom.map_or(true, |w| w == *i))
                .map(|(_, r)| r)
        };
        chosen().for_each(|r| r.set(self.link));
        tokio::time::sleep(self.lasts).await;
        chosen().for_each(|r| r.set(Link::Up));
    }
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

    #[tokio::test]
    async fn a_route_rewrites_each_address_to_one_proxy_and_refuses_what_it_cannot_cut() {
        let r = Route::new("redlock://127.0.0.1:7001,localhost:7002,127.0.0.1:7001")
            .await
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
            assert!(Route::new(refused).await.is_err(), "{refused}");
        }
    }

    async fn round_trip(c: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        let mut buf = [0u8; 4];
        c.write_all(b"ping").await?;
        c.read_exact(&mut buf).await.map(|_| buf)
    }

    #[tokio::test]
    async fn a_proxy_forwards_slows_holds_and_resets() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        let echo = tokio::spawn(async move {
            loop {
                let (mut s, _) = server.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let route = Route::new(&format!("redis://127.0.0.1:{port}"))
            .await
            .unwrap();
        let proxied = loopback_addresses(&route.url)[0].port;
        let mut c = TcpStream::connect(("127.0.0.1", proxied)).await.unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(&round_trip(&mut c).await.unwrap(), b"ping");
        // Slow: each chunk waits, one way and back.
        route.set(Link::Slow(Duration::from_millis(100)));
        let t = std::time::Instant::now();
        round_trip(&mut c).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        // A black hole holds the bytes, and passes them when it lifts.
        route.set(Link::Hole);
        c.write_all(b"hole").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(200), c.read_exact(&mut buf)).await;
        assert!(held.is_err(), "the black hole let bytes through");
        route.set(Link::Up);
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hole");
        // A reset ends the connection with RST, and refuses new ones.
        route.set(Link::Reset);
        let err = c.read(&mut buf).await;
        assert!(
            err.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{err:?}"
        );
        let mut d = TcpStream::connect(("127.0.0.1", proxied)).await.unwrap();
        assert!(round_trip(&mut d).await.is_err());
        route.set(Link::Up);
        let mut e = TcpStream::connect(("127.0.0.1", proxied)).await.unwrap();
        assert_eq!(&round_trip(&mut e).await.unwrap(), b"ping");
        echo.abort();
    }
}
