//! A fault-injecting TCP proxy: it stands where a client reaches a server in production (a DNS
//! name, a load balancer, a network path), forwards bytes unchanged and knows nothing of the
//! protocol, and breaks the way those break, as its [`Link`] says: added latency, answers held
//! or lost, a black hole, connection resets.
//!
//! The target can be moved ([`TcpProxy::point_to`]): new connections go there, connections
//! already made keep forwarding to the old one, as they do when a DNS name is repointed during a
//! failover. A link switch applies to the connections already open too.
//!
//! Proxies can share their links ([`Links`]: one per party, switched from anywhere), and a
//! connection can answer to several parties' links, going as the most cutting of them: a proxy's
//! own party, and those its [`TcpProxyOptions::parties_of`] finds for the connection (who
//! dialed it, say).
//!
//! Every proxy of the process runs on one runtime of its own (two threads), so that a proxy is
//! started, switched and dropped alike from a plain thread and from inside any tokio runtime.

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::WriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// What a proxy does with the bytes between its clients and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Bytes pass as they come.
    Up,
    /// Each piece read, either way, is passed on this long after it was read (added latency).
    Slow(Duration),
    /// The client's bytes reach the server; the server's are kept, in the pieces they were read
    /// in, and delivered when the link lets them pass again: the server does what it is asked and
    /// its client hears nothing until then (an answer late in a leader change).
    HoldAnswers,
    /// The client's bytes reach the server; the server's are read and dropped: the server does
    /// what it is asked and its client never hears of it. Every connection open while the link is
    /// muted is reset (RST) once it is no longer: its byte stream lost answers, and its client
    /// connects again and retries.
    Mute,
    /// Nothing passes either way, and nothing is closed: what is read is kept until the link lets
    /// it pass (a black hole: a partition that neither side sees as such, a hung load balancer).
    Hole,
    /// Every connection is closed with a reset (RST), and new ones are reset as they come.
    Reset,
}

impl Link {
    /// How much it cuts: a connection under several links goes as the most cutting.
    fn severity(self) -> u8 {
        match self {
            Link::Up => 0,
            Link::Slow(_) => 1,
            Link::HoldAnswers => 2,
            Link::Mute => 3,
            Link::Hole => 4,
            Link::Reset => 5,
        }
    }

    /// Whether the bytes going `to_client` (else to the server) wait.
    fn holds(self, to_client: bool) -> bool {
        match self {
            Link::Hole => true,
            Link::HoldAnswers => to_client,
            Link::Up | Link::Slow(_) | Link::Mute | Link::Reset => false,
        }
    }

    /// The latency it adds to each piece.
    fn latency(self) -> Duration {
        match self {
            Link::Slow(d) => d,
            _ => Duration::ZERO,
        }
    }
}

/// One party's link, and how far apart the pieces kept while it held are delivered.
#[derive(Debug, Clone, Copy)]
struct Setting {
    link: Link,
    pace: Duration,
}

impl Setting {
    const UP: Setting = Setting {
        link: Link::Up,
        pace: Duration::ZERO,
    };
}

/// The links of a set of proxies, one per party (a client, a cluster member…), all
/// [`Link::Up`] at first; cloned, the same links. Switching a link applies at once to every
/// connection that answers to it, open ones included.
#[derive(Debug, Clone)]
pub struct Links(watch::Sender<Vec<Setting>>);

impl Links {
    /// Links for `parties` parties.
    pub fn new(parties: usize) -> Links {
        Links(watch::Sender::new(vec![Setting::UP; parties]))
    }

    /// Switches `party`'s link (nothing when there is no such party).
    pub fn set(&self, party: usize, link: Link) {
        self.put(party, link, Duration::ZERO);
    }

    /// Lets `party`'s bytes pass again ([`Link::Up`]): what was kept first, in the pieces it was
    /// read in, `pace` apart (so that the client handles one answer before it reads the next).
    pub fn release(&self, party: usize, pace: Duration) {
        self.put(party, Link::Up, pace);
    }

    fn put(&self, party: usize, link: Link, pace: Duration) {
        self.0.send_modify(|links| {
            if let Some(s) = links.get_mut(party) {
                *s = Setting { link, pace };
            }
        });
    }
}

/// Who else a connection answers to, from its client's address and the proxy's (the accepted
/// socket's two ends): parties of the proxy's [`Links`].
pub type PartiesOf = Arc<dyn Fn(SocketAddr, SocketAddr) -> Vec<usize> + Send + Sync>;

/// How to start a [`TcpProxy`]: where it forwards, and which links it answers to.
#[derive(Clone)]
pub struct TcpProxyOptions {
    host: String,
    port: u16,
    links: Option<(Links, usize)>,
    parties_of: Option<PartiesOf>,
}

impl std::fmt::Debug for TcpProxyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpProxyOptions")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("links", &self.links)
            .field("parties_of", &self.parties_of.is_some())
            .finish()
    }
}

impl TcpProxyOptions {
    /// Forwarding to `host:port`, a loopback host (`127.0.0.1`, `localhost`, `::1`; the proxy
    /// listens on `[::1]` for `::1`, else on `127.0.0.1`). Port 0 is nowhere: connections are
    /// reset until [`TcpProxy::point_to`] names a port. By default the proxy has links of its
    /// own, one party.
    pub fn new(host: impl Into<String>, port: u16) -> TcpProxyOptions {
        TcpProxyOptions {
            host: host.into(),
            port,
            links: None,
            parties_of: None,
        }
    }

    /// Every connection answers to `party` of `links` (shared with other proxies).
    pub fn links(mut self, links: &Links, party: usize) -> TcpProxyOptions {
        self.links = Some((links.clone(), party));
        self
    }

    /// Every connection also answers to the parties `find` gives for it, from its client's
    /// address and the proxy's (called once per connection, on a thread that may block).
    pub fn parties_of(
        mut self,
        find: impl Fn(SocketAddr, SocketAddr) -> Vec<usize> + Send + Sync + 'static,
    ) -> TcpProxyOptions {
        self.parties_of = Some(Arc::new(find));
        self
    }
}

/// Where a proxy forwards.
#[derive(Debug)]
struct Target {
    host: String,
    port: AtomicU16,
}

/// A forwarder listening on a free loopback port. Dropped, it stops: its port is closed and its
/// connections end.
#[derive(Debug)]
pub struct TcpProxy {
    /// The port it listens on.
    pub port: u16,
    target: Arc<Target>,
    links: Links,
    party: usize,
    accepting: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding connections to `127.0.0.1:target`, with links of its own.
    ///
    /// # Errors
    /// As [`TcpProxy::start_with`].
    pub fn start(target: u16) -> Result<TcpProxy> {
        TcpProxy::start_with(TcpProxyOptions::new("127.0.0.1", target))
    }

    /// Starts forwarding as `options` say.
    ///
    /// # Errors
    /// When no loopback port can be bound, or the proxies' runtime cannot be started.
    pub fn start_with(options: TcpProxyOptions) -> Result<TcpProxy> {
        let listen = if options.host == "::1" {
            "[::1]:0"
        } else {
            "127.0.0.1:0"
        };
        let what = || format!("listen on {listen} for a TCP proxy");
        let listener = std::net::TcpListener::bind(listen).map_err(Error::io(what()))?;
        let port = listener.local_addr().map_err(Error::io(what()))?.port();
        listener.set_nonblocking(true).map_err(Error::io(what()))?;
        let runtime = runtime()?;
        let listener = {
            let _inside = runtime.enter();
            TcpListener::from_std(listener).map_err(Error::io(what()))?
        };
        let (links, party) = options.links.unwrap_or_else(|| (Links::new(1), 0));
        let target = Arc::new(Target {
            host: options.host,
            port: AtomicU16::new(options.port),
        });
        let accepting = runtime.spawn(accept(
            listener,
            Arc::clone(&target),
            links.0.subscribe(),
            party,
            options.parties_of,
        ));
        Ok(TcpProxy {
            port,
            target,
            links,
            party,
            accepting,
        })
    }

    /// Sends new connections to port `target` of its host from now on.
    pub fn point_to(&self, target: u16) {
        self.target.port.store(target, Ordering::Release);
    }

    /// Switches this proxy's link (its party's, in shared [`Links`]).
    pub fn set(&self, link: Link) {
        self.links.set(self.party, link);
    }

    /// Holds every byte in both directions, on every connection, until
    /// [`resume`](Self::resume) ([`Link::Hole`]): the server unreachable from this proxy's
    /// clients only. Connections stay open; nothing is lost.
    pub fn pause(&self) {
        self.set(Link::Hole);
    }

    /// Forwards again, what was held first.
    pub fn resume(&self) {
        self.set(Link::Up);
    }

    /// Holds what the server sends, on every connection, until
    /// [`release_answers`](Self::release_answers) ([`Link::HoldAnswers`]); requests still reach
    /// it.
    pub fn hold_answers(&self) {
        self.set(Link::HoldAnswers);
    }

    /// Forwards what the server sends again: what was held first, in the pieces it was read in,
    /// `pace` apart ([`Links::release`]).
    pub fn release_answers(&self, pace: Duration) {
        self.links.release(self.party, pace);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // The accepting task owns the listener and the connections' tasks.
        self.accepting.abort();
    }
}

/// The runtime every proxy of the process runs on, started on first use and never stopped.
fn runtime() -> Result<&'static Runtime> {
    static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("leasehold-tcp-proxy")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::Setup(format!("the TCP proxies' runtime did not start: {e}")))
}

/// Accepts connections on `listener` and forwards each to `target` under the links of `party`
/// (and of the parties `parties_of` finds), until aborted: then the connections end too.
async fn accept(
    listener: TcpListener,
    target: Arc<Target>,
    links: watch::Receiver<Vec<Setting>>,
    party: usize,
    parties_of: Option<PartiesOf>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, from)) => {
                    let view = View {
                        links: links.clone(),
                        parties: vec![party],
                    };
                    let (target, parties_of) = (Arc::clone(&target), parties_of.clone());
                    connections.spawn(connection(client, from, target, view, parties_of));
                }
                // Out of descriptors, most likely: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The links one connection answers to.
struct View {
    links: watch::Receiver<Vec<Setting>>,
    parties: Vec<usize>,
}

impl View {
    /// The connection's setting now: the most cutting of its parties'.
    fn now(&mut self) -> Setting {
        let links = self.links.borrow_and_update();
        self.parties
            .iter()
            .filter_map(|p| links.get(*p).copied())
            .max_by_key(|s| s.link.severity())
            .unwrap_or(Setting::UP)
    }

    /// Waits until a link changes: false when the links are gone.
    async fn changed(&mut self) -> bool {
        self.links.changed().await.is_ok()
    }
}

/// Forwards one accepted connection to the target.
async fn connection(
    client: TcpStream,
    from: SocketAddr,
    target: Arc<Target>,
    mut view: View,
    parties_of: Option<PartiesOf>,
) {
    if let (Some(find), Ok(local)) = (parties_of, client.local_addr()) {
        let found = tokio::task::spawn_blocking(move || find(from, local)).await;
        view.parties.extend(found.unwrap_or_default());
    }
    if view.now().link == Link::Reset {
        reset(client);
        return;
    }
    let server = match target.port.load(Ordering::Acquire) {
        0 => None,
        port => TcpStream::connect((target.host.as_str(), port)).await.ok(),
    };
    match server {
        Some(server) => forward(client, server, view).await,
        // Nowhere to forward: the client's connection is refused after the fact.
        None => reset(client),
    }
}

/// Closes `stream` with a reset (RST) rather than a FIN.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// What a reader of either side takes in at once.
const PIECE: usize = 16 * 1024;
/// What one direction keeps unwritten before it stops reading (then the kernel's buffers fill).
const KEPT: usize = 4 << 20;

/// A piece read, waiting to be written.
struct Piece {
    bytes: Vec<u8>,
    read_at: Instant,
    /// Read while its direction was held: delivered at the release's pace.
    held: bool,
}

/// One direction of a connection: what was read and is not written yet.
#[derive(Default)]
struct Flow {
    pieces: VecDeque<Piece>,
    kept: usize,
    /// How much of the first piece is written.
    written: usize,
    /// Its reading side ended: once the pieces are written its writing side is shut.
    ended: bool,
    shut: bool,
    /// No write before this (the pace after a piece that was held).
    not_before: Option<Instant>,
}

impl Flow {
    /// Whether to read more for it.
    fn reading(&self) -> bool {
        !self.ended && self.kept < KEPT
    }

    /// Whether it is over: its reading side ended and its writing side is shut.
    fn done(&self) -> bool {
        self.ended && self.shut
    }

    /// Takes what a read gave (an end or an error ends the direction).
    fn read(&mut self, read: std::io::Result<usize>, buf: &[u8], held: bool) {
        match read {
            Ok(n) if n > 0 => {
                self.kept += n;
                self.pieces.push_back(Piece {
                    bytes: buf[..n].to_vec(),
                    read_at: Instant::now(),
                    held,
                });
            }
            _ => self.ended = true,
        }
    }

    /// Drops what waits (lost answers).
    fn drop_all(&mut self) {
        self.pieces.clear();
        self.kept = 0;
        self.written = 0;
    }

    /// When the first piece may be written under `link` (`to_client`: the server's direction),
    /// if it may.
    fn due(&self, link: Link, to_client: bool) -> Option<Instant> {
        let first = self.pieces.front()?;
        if link.holds(to_client) {
            return None;
        }
        let at = first.read_at + link.latency();
        Some(self.not_before.map_or(at, |p| p.max(at)))
    }

    /// Writes (part of) the first piece to `to` at `at`.
    async fn write(&self, to: &mut WriteHalf<'_>, at: Instant) -> std::io::Result<usize> {
        tokio::time::sleep_until(at).await;
        match self.pieces.front() {
            Some(p) => to.write(&p.bytes[self.written..]).await,
            None => Ok(0),
        }
    }

    /// Counts `n` bytes of the first piece written, the next write then `pace` after a held
    /// piece.
    fn wrote(&mut self, n: usize, pace: Duration) {
        self.written += n;
        self.kept = self.kept.saturating_sub(n);
        if self
            .pieces
            .front()
            .is_some_and(|p| self.written >= p.bytes.len())
        {
            self.written = 0;
            if let Some(p) = self.pieces.pop_front() {
                self.not_before = (p.held && !pace.is_zero()).then(|| Instant::now() + pace);
            }
        }
    }
}

/// How a connection's forwarding ended.
#[derive(PartialEq, Eq)]
enum Ending {
    Closed,
    Reset,
}

/// Passes bytes between `client` and `server` as the links of `view` say, until both directions
/// ended, a write fails, the link resets, a connection that was muted is no longer, or the links
/// are gone; ends with a reset when the link said so.
async fn forward(mut client: TcpStream, mut server: TcpStream, mut view: View) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    if pass(&mut client, &mut server, &mut view).await == Ending::Reset {
        reset(client);
        reset(server);
    }
}

/// The loop of [`forward`]: reads either side into its direction's [`Flow`] and writes each
/// direction's pieces when the link lets them go.
async fn pass(client: &mut TcpStream, server: &mut TcpStream, view: &mut View) -> Ending {
    let (mut from_client, mut to_client) = client.split();
    let (mut from_server, mut to_server) = server.split();
    let (mut requests, mut answers) = (Flow::default(), Flow::default());
    let mut request = vec![0u8; PIECE];
    let mut answer = vec![0u8; PIECE];
    // Whether the link was muted while this connection was open: its answers may be lost, so it
    // is reset once the link is no longer muted.
    let mut muted = false;
    loop {
        let now = view.now();
        muted |= now.link == Link::Mute;
        if now.link == Link::Reset || (muted && now.link != Link::Mute) {
            return Ending::Reset;
        }
        if now.link == Link::Mute {
            answers.drop_all();
        }
        for (flow, to) in [
            (&mut requests, &mut to_server),
            (&mut answers, &mut to_client),
        ] {
            if flow.ended && flow.pieces.is_empty() && !flow.shut {
                let _ = to.shutdown().await;
                flow.shut = true;
            }
        }
        if requests.done() && answers.done() {
            return Ending::Closed;
        }
        let request_due = requests.due(now.link, false);
        let answer_due = answers.due(now.link, true);
        tokio::select! {
            changed = view.changed() => if !changed {
                return Ending::Closed;
            },
            read = from_client.read(&mut request), if requests.reading() => {
                requests.read(read, &request, now.link.holds(false));
            }
            read = from_server.read(&mut answer), if answers.reading() => {
                answers.read(read, &answer, now.link.holds(true));
            }
            wrote = requests.write(&mut to_server, request_due.unwrap_or_else(Instant::now)),
                if request_due.is_some() => match wrote {
                    Ok(n) if n > 0 => requests.wrote(n, now.pace),
                    _ => return Ending::Closed,
                },
            wrote = answers.write(&mut to_client, answer_due.unwrap_or_else(Instant::now)),
                if answer_due.is_some() => match wrote {
                    Ok(n) if n > 0 => answers.wrote(n, now.pace),
                    _ => return Ending::Closed,
                },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// An echo server on a free loopback port, which also sends what it receives to the test.
    async fn echo() -> (u16, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        let (seen, received) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = server.accept().await.unwrap();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        let _ = seen.send(buf[..n].to_vec());
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (port, received)
    }

    async fn round_trip(c: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        let mut buf = [0u8; 4];
        c.write_all(b"ping").await?;
        c.read_exact(&mut buf).await.map(|_| buf)
    }

    /// A proxy in front of an [`echo`] server, a connection through it that made one round
    /// trip, and what the server receives from then on.
    async fn proxied() -> (
        TcpProxy,
        TcpStream,
        tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    ) {
        let (port, mut received) = echo().await;
        let proxy = TcpProxy::start(port).unwrap();
        let mut c = connect(&proxy).await;
        assert_eq!(&round_trip(&mut c).await.unwrap(), b"ping");
        assert_eq!(received.recv().await.unwrap(), b"ping");
        (proxy, c, received)
    }

    async fn connect(proxy: &TcpProxy) -> TcpStream {
        TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap()
    }

    /// Nothing arrives on `c` for 200 ms.
    async fn silent(c: &mut TcpStream, what: &str) {
        let mut buf = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_millis(200), c.read_exact(&mut buf)).await;
        assert!(read.is_err(), "{what}: {buf:?}");
    }

    async fn is_reset(c: &mut TcpStream) {
        let mut buf = [0u8; 4];
        let err = c.read(&mut buf).await;
        assert!(
            err.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_proxy_forwards_slows_holds_and_resets() {
        let (proxy, mut c, _) = proxied().await;
        let mut buf = [0u8; 4];
        // Slow: each piece waits, one way and back.
        proxy.set(Link::Slow(Duration::from_millis(100)));
        let t = std::time::Instant::now();
        round_trip(&mut c).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        // A black hole holds the bytes, and passes them when it lifts.
        proxy.pause();
        c.write_all(b"hole").await.unwrap();
        silent(&mut c, "the black hole let bytes through").await;
        proxy.resume();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hole");
        // A reset ends the connection with RST, and refuses new ones.
        proxy.set(Link::Reset);
        is_reset(&mut c).await;
        // (The reset may come before the connection is seen as made.)
        if let Ok(mut d) = TcpStream::connect(("127.0.0.1", proxy.port)).await {
            assert!(round_trip(&mut d).await.is_err());
        }
        proxy.set(Link::Up);
        let mut e = connect(&proxy).await;
        assert_eq!(&round_trip(&mut e).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn a_muted_proxy_passes_requests_loses_answers_then_resets() {
        let (proxy, mut c, mut received) = proxied().await;
        // Muted: the request reaches the server, its answer never comes; a connection made
        // meanwhile is muted too.
        proxy.set(Link::Mute);
        c.write_all(b"lost").await.unwrap();
        assert_eq!(received.recv().await.unwrap(), b"lost");
        silent(&mut c, "an answer went through").await;
        let mut d = connect(&proxy).await;
        d.write_all(b"also").await.unwrap();
        assert_eq!(received.recv().await.unwrap(), b"also");
        // Unmuted: both connections are reset, the lost answers never delivered; a new one
        // passes.
        proxy.set(Link::Up);
        is_reset(&mut c).await;
        is_reset(&mut d).await;
        let mut e = connect(&proxy).await;
        assert_eq!(&round_trip(&mut e).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn held_answers_are_delivered_in_their_pieces_at_the_release_pace() {
        let (proxy, mut c, mut received) = proxied().await;
        proxy.hold_answers();
        for word in [b"one!", b"two!", b"six!"] {
            c.write_all(word).await.unwrap();
            // Each request reaches the server, and is echoed, before the next is sent.
            assert_eq!(received.recv().await.unwrap(), word);
        }
        silent(&mut c, "an answer went through").await;
        let mut buf = [0u8; 4];
        let released = std::time::Instant::now();
        proxy.release_answers(Duration::from_millis(100));
        let mut arrived = vec![];
        for _ in 0..3 {
            c.read_exact(&mut buf).await.unwrap();
            arrived.push((buf, released.elapsed()));
        }
        assert_eq!(
            arrived.iter().map(|a| a.0).collect::<Vec<_>>(),
            [*b"one!", *b"two!", *b"six!"]
        );
        assert!(arrived[0].1 < Duration::from_millis(100), "{arrived:?}");
        assert!(arrived[2].1 >= Duration::from_millis(200), "{arrived:?}");
        // Answers read after the release pass unpaced: two round trips within the pace.
        let t = std::time::Instant::now();
        assert_eq!(&round_trip(&mut c).await.unwrap(), b"ping");
        assert_eq!(&round_trip(&mut c).await.unwrap(), b"ping");
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_moved_target_takes_new_connections_and_the_old_ones_stay() {
        use std::io::{Read, Write};
        let old = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let new = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = TcpProxy::start(old.local_addr().unwrap().port()).unwrap();
        let first = std::net::TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        let (mut at_old, _) = old.accept().unwrap();
        proxy.point_to(new.local_addr().unwrap().port());
        let _second = std::net::TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        let (_at_new, _) = new.accept().unwrap();
        (&first).write_all(b"old!").unwrap();
        let mut buf = [0u8; 4];
        at_old.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"old!");
        // Dropped: the port is closed and the connections end.
        let port = proxy.port;
        drop(proxy);
        at_old
            .read_exact(&mut buf)
            .expect_err("the connection outlived its proxy");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "port {port} still open"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[tokio::test]
    async fn a_connection_goes_as_the_most_cutting_of_its_parties_links() {
        let (port, _) = echo().await;
        let links = Links::new(2);
        // Every connection also answers to party 1.
        let proxy = TcpProxy::start_with(
            TcpProxyOptions::new("127.0.0.1", port)
                .links(&links, 0)
                .parties_of(|_, _| vec![1]),
        )
        .unwrap();
        let mut c = connect(&proxy).await;
        assert_eq!(&round_trip(&mut c).await.unwrap(), b"ping");
        links.set(1, Link::Hole);
        links.set(0, Link::Slow(Duration::from_millis(10)));
        c.write_all(b"ping").await.unwrap();
        silent(&mut c, "the other party's black hole let bytes through").await;
        links.set(1, Link::Up);
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }
}
