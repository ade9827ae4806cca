//! Real servers for tests: started from the project's own code on free 127.0.0.1 ports, in temp
//! dirs, and stopped by PID.
//!
//! A server that cannot start fails the test loudly, naming what is missing (run `./scripts/test`,
//! which installs it); no test is ever skipped for lack of a server.
//!
//! Servers are started from one long-lived launcher thread with `PR_SET_PDEATHSIG`, so they die
//! with the test process even when it is killed; [`RedisServer`] also stops its server on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The file in a [`server_dir`] naming the test process that made it.
const OWNER: &str = "owner.pid";

/// A directory under /tmp for a server's files, named `leasehold-<kind>-…`, with [`OWNER`]
/// naming this process. A shared server lives in a static that is never dropped, so its directory
/// outlives the process (the server itself dies with it, by `PR_SET_PDEATHSIG`) — etcd's and
/// PostgreSQL's hold ≈ 125–140 MB each; the first call in a process removes the directories of
/// processes that are gone.
pub(crate) fn server_dir(kind: &str) -> tempfile::TempDir {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_stale_dirs);
    let dir = tempfile::Builder::new()
        .prefix(&format!("leasehold-{kind}-"))
        .tempdir_in("/tmp")
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    std::fs::write(dir.path().join(OWNER), std::process::id().to_string())
        .unwrap_or_else(|e| panic!("write {OWNER}: {e}"));
    dir
}

/// Removes the [`server_dir`]s that earlier test processes left under /tmp: one older than a
/// minute whose owner (its [`OWNER`] file, or for older PostgreSQL directories the server's
/// `postmaster.pid`) is no live process.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let ours = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("leasehold-"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60));
        if !ours || !old {
            continue;
        }
        let pid = |file: PathBuf| -> Option<i32> {
            let text = std::fs::read_to_string(file).ok()?;
            text.lines().next()?.trim().parse().ok()
        };
        let Some(owner) = pid(path.join(OWNER)).or_else(|| pid(path.join("data/postmaster.pid")))
        else {
            continue;
        };
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        let alive = owner > 0 && unsafe { libc::kill(owner, 0) } == 0;
        if !alive {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Checks `ready` every `every` until it holds; panics with `failure()` once `limit` has passed
/// (a server that does not come up fails the test loudly).
fn poll_until(
    limit: Duration,
    every: Duration,
    mut ready: impl FnMut() -> bool,
    failure: impl Fn() -> String,
) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{}", failure());
        std::thread::sleep(every);
    }
}

/// Runs `start` until it gives a server, three times at most (a start fails when another process
/// took a port between [`free_port`] and the server's bind); each failure is logged on stderr.
///
/// # Panics
/// When all three fail, with each failure.
pub(crate) fn in_three_starts<T>(what: &str, mut start: impl FnMut() -> Result<T, String>) -> T {
    let mut failures = Vec::new();
    for _ in 0..3 {
        match start() {
            Ok(server) => return server,
            Err(why) => {
                eprintln!("{what} did not start: {why}");
                failures.push(why);
            }
        }
    }
    panic!(
        "{what} did not start in 3 attempts:\n{}",
        failures.join("\n")
    );
}

/// Waits until `ready` holds for a server that `child` runs, checking every `every` for at most
/// `limit`; an error names `what` and says whether the process exited or ran out of time, and the
/// process is then killed and reaped.
pub(crate) fn wait_up(
    child: &mut Child,
    what: &str,
    limit: Duration,
    every: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{what} exited ({status})"));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not come up within {limit:?}"));
        }
        std::thread::sleep(every);
    }
}

/// `why` a server did not start, with its log file `log` (empty if there is none).
fn with_log(why: &str, log: &Path) -> String {
    format!(
        "{why}; its log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    )
}

/// A connection to `127.0.0.1:port`, unless nothing listens there — or the connection is to
/// itself. Probing a port in the ephemeral range before its server binds it can pick that very
/// port as the local end, and TCP's simultaneous open then connects the socket to itself: it holds
/// the port, so the server starting there fails to bind ("address already in use").
fn connect_loopback(port: u16) -> Option<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    (s.local_addr().ok()? != s.peer_addr().ok()?).then_some(s)
}

/// A free loopback port (bound and released; the server binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// A loopback TCP server that is not Redis: it answers whatever it reads with an HTTP error
/// followed by bytes that are not text (a misconfigured port, a proxy in the way), on every
/// connection, until dropped. Dropped, it closes its listener and every connection, and returns
/// once the port is free again (a real server can then be started on it).
#[derive(Debug)]
pub struct GarbageServer {
    /// Its loopback port.
    pub port: u16,
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    connections: std::sync::Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl GarbageServer {
    /// Starts one on a free port.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start() -> Self {
        Self::start_on(0)
    }

    /// Starts one on `port` (where a stopped server listened; 0: a free port).
    ///
    /// # Panics
    /// When the port cannot be bound.
    pub fn start_on(port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("cannot bind loopback port {port}: {e}"));
        let port = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no local address: {e}"));
        let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connections = std::sync::Arc::new(Mutex::new(Vec::<TcpStream>::new()));
        let (stop, open) = (stopping.clone(), connections.clone());
        let acceptor = std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                if let (Ok(mut s), Ok(kept)) = (s.try_clone(), s.try_clone()) {
                    if let Ok(mut open) = open.lock() {
                        open.push(kept);
                    }
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        while matches!(s.read(&mut buf), Ok(n) if n > 0) {
                            if s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n\x00\xff garbage")
                                .is_err()
                            {
                                break;
                            }
                        }
                    });
                }
            }
        });
        GarbageServer {
            port,
            stopping,
            connections,
            acceptor: Some(acceptor),
        }
    }
}

impl Drop for GarbageServer {
    fn drop(&mut self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the acceptor, which then sees the flag and drops the listener.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        if let Ok(mut open) = self.connections.lock() {
            for s in open.drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from the launcher thread, which lives as long as the process: with
/// `PR_SET_PDEATHSIG` the child is killed when this process dies.
pub(crate) fn spawn(mut cmd: Command) -> std::io::Result<Child> {
    static LAUNCHER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let tx = LAUNCHER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                use std::os::unix::process::CommandExt;
                // SAFETY: prctl is async-signal-safe; called between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let _ = reply.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    cmd.stdin(Stdio::null());
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .map_err(std::io::Error::other)?;
    reply_rx.recv().map_err(std::io::Error::other)?
}

/// The least an ACL user of the Redis and Redlock stores needs with the default prefixes (the
/// README's line), as user `locker` with password `s3cret`: its record and counter keys, its
/// channels, the script calls and the commands inside the scripts, `GET`/`SCAN`/`MGET` for
/// inspection and listing, pub/sub. (`+select` too for a database other than 0.)
pub const LOCKER_ACL: &str = "locker on >s3cret ~leasehold:* &leasehold:* -@all +evalsha +eval +get +mget +scan +subscribe +unsubscribe +set +del +incrby +time +publish";

/// The name of a [`RedisServer`]'s Unix socket in its directory.
const SOCKET: &str = "redis.sock";

/// The server's log file, in its directory.
const LOG: &str = "redis.log";

/// Whether a [`RedisServer`] speaks TLS, and with which certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tls<'a> {
    Off,
    /// A fresh CA and server certificate in its directory.
    Fresh,
    /// The CA and server certificate of this directory (shared by a cluster's nodes).
    From(&'a std::path::Path),
}

/// A `redis-server` on a free port (and a Unix socket in its directory) with no persistence,
/// stopped (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// Its port.
    pub port: u16,
    tls: bool,
    /// It asks clients for a certificate.
    mtls: bool,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not come up within 10 s.
    pub fn start() -> Self {
        Self::launch(Tls::Off, &[])
    }

    /// Starts a server on `port` (to restart one in place).
    pub fn start_on(port: u16) -> Self {
        Self::launch_on(port, Tls::Off, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server with ACL users besides the default one (which stays usable without a
    /// password: [`RedisServer::ping`] and [`RedisServer::command`] use it); each entry is a
    /// `user` line of `redis.conf`, e.g. [`LOCKER_ACL`].
    pub fn start_with_users(users: &[&str]) -> Self {
        let config: Vec<&str> = users
            .iter()
            .flat_map(|u| std::iter::once("--user").chain(u.split(' ')))
            .collect();
        Self::launch(Tls::Off, &config)
    }

    /// Starts a server that speaks only TLS, with a fresh CA and server certificate made by
    /// `openssl` in its directory; [`RedisServer::url`] then gives `rediss://…?ca=…`.
    pub fn start_tls() -> Self {
        Self::launch(Tls::Fresh, &[])
    }

    /// [`RedisServer::start_tls`] with a server that requires a client certificate from its CA
    /// (`tls-auth-clients yes`, Redis's own default); [`RedisServer::url`] then adds `&cert=…&key=…`.
    pub fn start_mtls() -> Self {
        let mut server = Self::launch(Tls::Fresh, &["--tls-auth-clients", "yes"]);
        server.mtls = true;
        server
    }

    /// Starts a server on a free port: up to three times, each on a new port (another process
    /// can take a port between [`free_port`] and the server's bind — an outgoing connection's
    /// ephemeral port, from the same range).
    fn launch(tls: Tls, config: &[&str]) -> Self {
        in_three_starts("redis-server", || Self::launch_on(free_port(), tls, config))
    }

    /// Starts a server on `port` and waits until it answers `PING`; an error (with the server's
    /// log) when it exits or does not answer within 10 s.
    fn launch_on(port: u16, tls: Tls, config: &[&str]) -> Result<Self, String> {
        let dir = server_dir("redis");
        let mut cmd = Command::new("redis-server");
        if tls != Tls::Off {
            match tls {
                Tls::From(certs) => {
                    for f in [
                        "ca.crt",
                        "server.crt",
                        "server.key",
                        "client.crt",
                        "client.key",
                    ] {
                        std::fs::copy(certs.join(f), dir.path().join(f))
                            .unwrap_or_else(|e| panic!("copy {f}: {e}"));
                    }
                }
                _ => make_certs(dir.path()),
            }
            let p = |f: &str| dir.path().join(f).display().to_string();
            cmd.args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-auth-clients",
                "no",
            ])
            .args([
                "--tls-cert-file",
                &p("server.crt"),
                "--tls-key-file",
                &p("server.key"),
            ])
            .args(["--tls-ca-cert-file", &p("ca.crt")]);
        } else {
            cmd.args(["--port", &port.to_string()]);
        }
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--unixsocket")
            .arg(dir.path().join(SOCKET))
            .args(["--unixsocketperm", "700"])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .arg("--logfile")
            .arg(dir.path().join(LOG))
            .args(config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let mut child = spawn(cmd).unwrap_or_else(|e| {
            panic!("cannot start redis-server ({e}): install it with `apt-get install redis-server`, or run ./scripts/test which does")
        });
        let mut server = RedisServer {
            port,
            tls: tls != Tls::Off,
            mtls: false,
            child: None,
            dir,
        };
        let up = wait_up(
            &mut child,
            &format!("redis-server on port {port}"),
            Duration::from_secs(10),
            Duration::from_millis(5),
            || server.ping(),
        );
        server.child = Some(child);
        match up {
            Ok(()) => Ok(server),
            Err(why) => Err(with_log(&why, &server.dir.path().join(LOG))),
        }
    }

    /// `redis://127.0.0.1:PORT/0` (or `rediss://…?ca=CA_FILE` for a TLS server).
    pub fn url(&self) -> String {
        if self.tls {
            let file = |f: &str| self.dir.path().join(f).display().to_string();
            let mut url = format!("rediss://127.0.0.1:{}/0?ca={}", self.port, file("ca.crt"));
            if self.mtls {
                url.push_str(&format!(
                    "&cert={}&key={}",
                    file("client.crt"),
                    file("client.key")
                ));
            }
            url
        } else {
            format!("redis://127.0.0.1:{}/0", self.port)
        }
    }

    /// `redis+unix:///DIR/redis.sock?db=0`: the same server through its Unix socket.
    pub fn unix_url(&self) -> String {
        format!("redis+unix://{}?db=0", self.socket().display())
    }

    /// The server's Unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join(SOCKET)
    }

    /// Whether this server, a replica (`REPLICAOF`), has its link to the primary up and has
    /// finished the initial sync.
    pub fn replica_synced(&self) -> bool {
        self.command(&["INFO", "replication"]).is_some_and(|i| {
            i.contains("master_link_status:up") && i.contains("master_sync_in_progress:0")
        })
    }

    /// Waits until this server, a replica, is [synced](RedisServer::replica_synced).
    ///
    /// # Panics
    /// When it has not within 10 s.
    pub async fn synced_as_replica(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.replica_synced() {
            assert!(
                std::time::Instant::now() < deadline,
                "replica never synced: {}",
                self.command(&["INFO", "replication"]).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until a client of this server is blocked (in `WAIT`, say: `blocked_clients` of
    /// `INFO clients`).
    ///
    /// # Panics
    /// When none is within 10 s.
    pub async fn a_client_blocked(&self) {
        let blocked = || {
            let info = self.command(&["INFO", "clients"]).unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !blocked() {
            assert!(
                std::time::Instant::now() < deadline,
                "no client blocked: {}",
                self.command(&["INFO", "clients"]).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A numeric field of `INFO replication` (`master_repl_offset`, `slave_repl_offset`).
    pub fn replication_offset(&self, field: &str) -> Option<u64> {
        let info = self.command(&["INFO", "replication"])?;
        let line = info.lines().find(|l| l.starts_with(field))?;
        line.split(':').nth(1)?.trim().parse().ok()
    }

    /// Waits until `replica` has received everything this primary had written when called.
    ///
    /// (`WAIT 1` from another connection, such as `redis-cli`'s, proves nothing: it waits only
    /// for that connection's own writes, and one that wrote nothing is answered at once.)
    ///
    /// # Panics
    /// When it has not within 10 s.
    pub async fn replicated_to(&self, replica: &RedisServer) {
        let written = self
            .replication_offset("master_repl_offset")
            .expect("the primary's replication offset");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while replica
            .replication_offset("slave_repl_offset")
            .is_none_or(|o| o < written)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the replica on port {} did not reach offset {written} within 10 s",
                replica.port
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether the server answers `PING` (for TLS, through `redis-cli --tls`).
    pub fn ping(&self) -> bool {
        self.command(&["PING"])
            .is_some_and(|r| r.starts_with("+PONG") || r.starts_with("PONG"))
    }

    /// Sends one command (RESP) and returns the raw first reply, if the server answers (for a TLS
    /// server: `redis-cli --tls`'s output).
    pub fn command(&self, args: &[&str]) -> Option<String> {
        if self.tls {
            return command_over_tls(self.port, &self.dir.path().join("ca.crt"), None, args);
        }
        command_on(self.port, args)
    }

    /// How many script calls (`EVAL` and `EVALSHA`) the server has run (`INFO commandstats`).
    pub fn script_calls(&self) -> u64 {
        self.command_stat("evalsha", "calls") + self.command_stat("eval", "calls")
    }

    /// One figure of `INFO commandstats` for `command` (`evalsha`, `cluster|slots`): `field` is
    /// `calls`, `rejected_calls` (refused before running: out of memory, ACL), `failed_calls`…;
    /// 0 when the server has not seen the command.
    pub fn command_stat(&self, command: &str, field: &str) -> u64 {
        let info = self.command(&["INFO", "commandstats"]).unwrap_or_default();
        let line = format!("cmdstat_{command}:");
        let field = format!("{field}=");
        info.lines()
            .filter_map(|l| l.strip_prefix(&line))
            .flat_map(|l| l.split(','))
            .filter_map(|f| f.strip_prefix(&field)?.trim().parse::<u64>().ok())
            .sum()
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` to the server process.
    pub fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid as i32, sig);
            }
        }
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The server's data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends one command (RESP) to the server (or sentinel) on loopback `port` and returns the raw
/// first reply, if it answers within 2 s.
pub fn command_on(port: u16, args: &[&str]) -> Option<String> {
    command_as(port, None, args)
}

/// One command to the TLS port `port` through `redis-cli --tls` (trusting `ca`, after `AUTH
/// password` when given); its output (`redis-cli`'s text, not raw RESP) when it succeeds.
fn command_over_tls(
    port: u16,
    ca: &std::path::Path,
    password: Option<&str>,
    args: &[&str],
) -> Option<String> {
    let mut cli = Command::new("redis-cli");
    cli.args(["--tls", "--cacert"])
        .arg(ca)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    // The client certificate next to the CA, for servers that ask for one.
    let dir = ca.parent().unwrap_or(std::path::Path::new("."));
    if dir.join("client.crt").exists() {
        cli.arg("--cert")
            .arg(dir.join("client.crt"))
            .arg("--key")
            .arg(dir.join("client.key"));
    }
    if let Some(pw) = password {
        cli.args(["--no-auth-warning", "-a", pw]);
    }
    let out = cli.args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`command_on`] after `AUTH password` when `password` is given.
fn command_as(port: u16, password: Option<&str>, args: &[&str]) -> Option<String> {
    match password {
        Some(pw) => commands_on(port, &[&["AUTH", pw], args]),
        None => commands_on(port, &[args]),
    }
}

/// Each command of `commands` in turn, on one connection to the loopback port `port`, as raw RESP;
/// the last one's reply, when every earlier one answered `+OK` (`AUTH`, `READONLY`).
pub fn commands_on(port: u16, commands: &[&[&str]]) -> Option<String> {
    let mut s = connect_loopback(port)?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut ask = |args: &[&str]| {
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut buf = [0u8; 65536];
        let n = s.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let (last, first) = commands.split_last()?;
    for c in first {
        ask(c).filter(|r| r.starts_with("+OK"))?;
    }
    ask(last)
}

/// The master group name a [`SentinelSet`]'s sentinels watch.
pub const SENTINEL_MASTER: &str = "leasehold";

/// A Sentinel deployment on free loopback ports: a primary with one replica, watched by three
/// sentinels (quorum 2; a primary silent for 500 ms is down). Every process stops on drop.
#[derive(Debug)]
pub struct SentinelSet {
    /// The data servers: the first starts as primary, the second as its replica (failovers swap
    /// the roles: [`SentinelSet::primary_port`] says which is primary now).
    pub servers: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<SentinelServer>,
    /// The CA and certificate every process of a TLS deployment uses.
    certs: Option<tempfile::TempDir>,
}

/// One `redis-server --sentinel` with its config file in a temp dir, stopped (SIGKILL) on drop.
#[derive(Debug)]
pub struct SentinelServer {
    /// Its port.
    pub port: u16,
    password: Option<String>,
    /// The CA to trust, for a sentinel that speaks TLS only.
    ca: Option<std::path::PathBuf>,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl SentinelServer {
    /// Sends `sig` to the sentinel process (SIGSTOP: it stops answering, its connections stay
    /// open, as behind a partition).
    pub fn signal(&self, sig: i32) {
        if let Some(pid) = self
            .child
            .as_ref()
            .and_then(|c| libc::pid_t::try_from(c.id()).ok())
        {
            // SAFETY: kill(2) on our own child's pid (not reaped: it is waited for on drop).
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// Sends one command (after `AUTH` if the sentinel has a password); the raw first reply (over
    /// TLS: `redis-cli`'s output).
    pub fn command(&self, args: &[&str]) -> Option<String> {
        match &self.ca {
            Some(ca) => command_over_tls(self.port, ca, self.password.as_deref(), args),
            None => command_as(self.port, self.password.as_deref(), args),
        }
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl SentinelSet {
    /// Starts the servers and sentinels and waits until the replica has synced and every sentinel
    /// knows the replica and the two other sentinels (so a failover can be agreed).
    ///
    /// # Panics
    /// When a process cannot start or the deployment does not settle within 30 s.
    pub fn start() -> Self {
        Self::start_with_password(None)
    }

    /// [`SentinelSet::start`] with sentinels that require `password` (`requirepass`, as Helm
    /// charts set them up); [`SentinelSet::url`] then carries it as `?sentinel_pass=`.
    ///
    /// # Panics
    /// As [`SentinelSet::start`].
    pub fn start_with_password(password: Option<&str>) -> Self {
        Self::launch(password, false)
    }

    /// [`SentinelSet::start`] over TLS only: data servers (replicating over TLS) and sentinels
    /// listen on TLS ports, with certificates from one test CA; [`SentinelSet::url`] is then
    /// `rediss+sentinel://…?ca=CA`.
    ///
    /// # Panics
    /// As [`SentinelSet::start`].
    pub fn start_tls() -> Self {
        Self::launch(None, true)
    }

    fn launch(password: Option<&str>, tls: bool) -> Self {
        let certs = tls.then(|| {
            let certs = server_dir("sentinel-certs");
            make_certs(certs.path());
            certs
        });
        let data_server = || match &certs {
            Some(c) => RedisServer::launch(Tls::From(c.path()), &["--tls-replication", "yes"]),
            None => RedisServer::start(),
        };
        let primary = data_server();
        let replica = data_server();
        let primary_port = primary.port.to_string();
        assert!(
            replica
                .command(&["REPLICAOF", "127.0.0.1", &primary_port])
                .is_some_and(|r| r.starts_with("+OK") || r.starts_with("OK")),
            "REPLICAOF refused"
        );
        // Each up to three times on a new port (another process can take one between `free_port`
        // and the sentinel's bind), waiting until it answers `PING`.
        let sentinels: Vec<SentinelServer> = (0..3)
            .map(|_| in_three_starts("redis-server --sentinel", || {
                let dir = server_dir("sentinel");
                let port = free_port();
                let conf = dir.path().join("sentinel.conf");
                let mut text = format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 500\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 5000\n",
                    dir.path().display()
                );
                if let Some(pw) = password {
                    // The sentinels talk to each other with the same password.
                    text.push_str(&format!("requirepass {pw}\nsentinel sentinel-pass {pw}\n"));
                }
                if let Some(c) = &certs {
                    // TLS only, to clients, data servers and the other sentinels alike.
                    let p = |f: &str| c.path().join(f).display().to_string();
                    text = text.replace(&format!("port {port}\n"), "port 0\n");
                    text.push_str(&format!(
                        "tls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                         tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                        p("server.crt"),
                        p("server.key"),
                        p("ca.crt")
                    ));
                }
                std::fs::write(&conf, text).unwrap_or_else(|e| panic!("sentinel.conf: {e}"));
                let mut cmd = Command::new("redis-server");
                cmd.arg(&conf)
                    .args(["--sentinel", "--daemonize", "no", "--loglevel", "warning"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit());
                let mut child = spawn(cmd).unwrap_or_else(|e| {
                    panic!("cannot start redis-server --sentinel ({e}): install redis-server, or run ./scripts/test which does")
                });
                let mut sentinel = SentinelServer {
                    port,
                    password: password.map(str::to_owned),
                    ca: certs.as_ref().map(|c| c.path().join("ca.crt")),
                    child: None,
                    _dir: dir,
                };
                let up = wait_up(
                    &mut child,
                    &format!("sentinel on port {port}"),
                    Duration::from_secs(10),
                    Duration::from_millis(5),
                    || {
                        sentinel
                            .command(&["PING"])
                            .is_some_and(|r| r.contains("PONG"))
                    },
                );
                sentinel.child = Some(child);
                up.map(|()| sentinel)
            }))
            .collect();
        let set = SentinelSet {
            servers: vec![primary, replica],
            sentinels,
            certs,
        };
        let settled = |s: &SentinelServer| {
            let ask = |what: &str| s.command(&["SENTINEL", what, SENTINEL_MASTER]);
            let others = ask("sentinels")
                .unwrap_or_default()
                .matches("runid")
                .count();
            let replicas = ask("replicas").unwrap_or_default();
            others == 2 && replicas.contains("master-link-status") && !replicas.contains("s_down")
        };
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || set.servers[1].replica_synced() && set.sentinels.iter().all(settled),
            || "the Sentinel deployment did not settle within 30 s".into(),
        );
        set
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/leasehold/0[?sentinel_pass=…]`,
    /// or `rediss+sentinel://…?ca=CA` over TLS.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let mut query = vec![];
        if let Some(pw) = &self.sentinels[0].password {
            query.push(format!("sentinel_pass={pw}"));
        }
        let mut scheme = "redis+sentinel";
        if let Some(c) = &self.certs {
            scheme = "rediss+sentinel";
            query.push(format!("ca={}", c.path().join("ca.crt").display()));
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        format!(
            "{scheme}://{}/{SENTINEL_MASTER}/0{query}",
            sentinels.join(",")
        )
    }

    /// [`SentinelSet::url`] with more query parameters (`timeout=1s`).
    pub fn url_with(&self, params: &str) -> String {
        let url = self.url();
        let join = if url.contains('?') { '&' } else { '?' };
        format!("{url}{join}{params}")
    }

    /// The port of the primary a sentinel that answers names now.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let reply = s.command(&["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER])?;
            // The port is the last line, in raw RESP (`*2 $9 127.0.0.1 $5 PORT`) and in
            // `redis-cli`'s output (`127.0.0.1 PORT`) alike.
            reply.lines().last()?.trim().parse().ok()
        })
    }

    /// The data server listening on `port`.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.servers.iter().find(|s| s.port == port)
    }

    /// Waits until every other data server has received what the one on `primary` had written
    /// ([`RedisServer::replicated_to`]).
    ///
    /// # Panics
    /// When `primary` is not one of the set's servers, or a replica lags 10 s.
    pub async fn replicated_from(&self, primary: u16) {
        let from = self
            .server(primary)
            .expect("the primary is one of the set's servers");
        for replica in self.servers.iter().filter(|s| s.port != primary) {
            from.replicated_to(replica).await;
        }
    }
}

/// A Sentinel deployment shared by all tests of this process.
pub fn shared_sentinels() -> &'static SentinelSet {
    static SET: OnceLock<SentinelSet> = OnceLock::new();
    SET.get_or_init(SentinelSet::start)
}

/// A TLS-only Redis server that requires a client certificate ([`RedisServer::start_mtls`])
/// shared by all tests of this process.
pub fn shared_redis_mtls() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start_mtls)
}

/// A TLS-only Sentinel deployment ([`SentinelSet::start_tls`]) shared by all tests of this
/// process.
pub fn shared_tls_sentinels() -> &'static SentinelSet {
    static SET: OnceLock<SentinelSet> = OnceLock::new();
    SET.get_or_init(SentinelSet::start_tls)
}

/// A Redis Cluster on loopback: three primaries and a replica of each, every one a
/// `redis-server --cluster-enabled yes` [`RedisServer`] (node timeout 2 s), joined with
/// `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes; the first three start as primaries (failovers change the roles:
    /// [`RedisCluster::primary_for`] says who serves a key now).
    pub nodes: Vec<RedisServer>,
    _certs: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts six nodes, creates the cluster and waits until every node sees it whole
    /// (`cluster_state:ok`, six known nodes) and every replica has synced.
    ///
    /// # Panics
    /// When a node cannot start, `redis-cli --cluster create` fails, or the cluster does not
    /// settle within 30 s.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// [`RedisCluster::start`] with nodes that speak only TLS, to clients and to each other
    /// (`--tls-cluster yes`, `--tls-replication yes`), all with one CA and server certificate;
    /// [`RedisCluster::url`] then gives `rediss+cluster://…?ca=…`.
    ///
    /// # Panics
    /// As [`RedisCluster::start`].
    pub fn start_tls() -> Self {
        Self::launch(true)
    }

    fn launch(tls: bool) -> Self {
        let certs = server_dir("cluster-certs");
        let mut config = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            // A node silent for 2 s is failed over. 1 s gave spurious failovers on a loaded
            // 2-core machine (a node busy for a second while several clusters start).
            "--cluster-node-timeout",
            "2000",
        ];
        let mode = if tls {
            make_certs(certs.path());
            config.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
            Tls::From(certs.path())
        } else {
            Tls::Off
        };
        let nodes: Vec<RedisServer> = (0..6).map(|_| RedisServer::launch(mode, &config)).collect();
        let mut create = Command::new("redis-cli");
        if tls {
            create
                .args(["--tls", "--cacert"])
                .arg(certs.path().join("ca.crt"));
        }
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install redis-tools, or run ./scripts/test which does"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster {
            nodes,
            _certs: certs,
        };
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || cluster.settled() && cluster.first_three_primaries(),
            || "the Redis Cluster did not settle within 30 s".into(),
        );
        cluster
    }

    /// Whether the first three nodes are primaries, as `redis-cli --cluster create` made them
    /// (tests and [`RedisCluster::url`] count on it). One that a failover made a replica while the
    /// cluster started (a node busy past the node timeout) is asked to take over again
    /// (`CLUSTER FAILOVER`, which loses no write).
    fn first_three_primaries(&self) -> bool {
        let mut all = true;
        for n in &self.nodes[..3] {
            if n.command(&["ROLE"]).is_some_and(|r| r.contains("slave")) {
                eprintln!(
                    "cluster node {} is a replica after a failover: failing back",
                    n.port
                );
                let _ = n.command(&["CLUSTER", "FAILOVER"]);
                all = false;
            }
        }
        all
    }

    /// Whether every live node sees the cluster whole and every live replica has synced.
    pub fn settled(&self) -> bool {
        self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
            let info = n.command(&["CLUSTER", "INFO"]).unwrap_or_default();
            let replica = n.command(&["ROLE"]).is_some_and(|r| r.contains("slave"));
            info.contains("cluster_state:ok") && (!replica || n.replica_synced())
        })
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3` (the first three nodes as seeds).
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes[..3]
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        if self.nodes[0].tls {
            let ca = self._certs.path().join("ca.crt");
            return format!("rediss+cluster://{}?ca={}", seeds.join(","), ca.display());
        }
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// The primary serving the Redis key `name` now: the live node that answers for it rather
    /// than redirecting (`-MOVED`). While none does (a failover under way), asks again for up to
    /// 5 s; `None` after that.
    pub fn primary_for(&self, name: &str) -> Option<&RedisServer> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found = self.nodes.iter().filter(|n| n.pid().is_some()).find(|n| {
                n.command(&["EXISTS", name])
                    .is_some_and(|r| r.starts_with(':'))
            });
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The replicas of the primary on `port`.
    pub fn replicas_of(&self, port: u16) -> Vec<&RedisServer> {
        let mark = format!("master_port:{port}");
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .filter(|n| {
                n.command(&["INFO", "replication"])
                    .is_some_and(|i| i.contains(&mark))
            })
            .collect()
    }

    /// The node on `port`, to stop or restart.
    pub fn node_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|n| n.port == port)
    }
}

/// A Redis Cluster shared by all tests of this process.
pub fn shared_redis_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// One Redis server shared by all tests of this process (each test uses its own key prefix).
pub fn shared_redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// Five Redis servers shared by all tests of this process, for Redlock (3 nodes use the first
/// three).
pub fn shared_redis_nodes() -> &'static [RedisServer] {
    static SERVERS: OnceLock<Vec<RedisServer>> = OnceLock::new();
    SERVERS.get_or_init(|| (0..5).map(|_| RedisServer::start()).collect())
}

/// `redlock://127.0.0.1:P1,…/0` over `servers`.
pub fn redlock_url(servers: &[RedisServer]) -> String {
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    redlock_url_of(&ports)
}

/// The `redlock://` URL of the loopback ports `ports` (database 0): Redis servers or not.
pub fn redlock_url_of(ports: &[u16]) -> String {
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!("redlock://{}/0", nodes.join(","))
}

/// Runs `openssl args` in `dir`.
///
/// # Panics
/// When openssl is missing or fails.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}): install it (apt-get install openssl)")
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A key and a certificate for `subject` (`name.key`, `name.crt` in `dir`), signed by the CA
/// of `dir` (`ca.crt`, `ca.key`), X.509 v3 with the extensions in `ext` (rustls takes no v1
/// certificate).
///
/// # Panics
/// When openssl is missing or fails.
pub fn sign_cert(dir: &std::path::Path, name: &str, subject: &str, ext: &str) {
    let ext_file = format!("{name}.ext");
    std::fs::write(dir.join(&ext_file), ext).unwrap_or_else(|e| panic!("write: {e}"));
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ],
    );
}

/// A fresh CA with a server certificate for 127.0.0.1 and `localhost` and a client certificate,
/// in a new temp dir: `ca.crt`, `server.crt`/`server.key`, `client.crt`/`client.key`. (A CA no
/// test server trusts, for tests of a certificate that must be refused.)
///
/// # Panics
/// When openssl is missing or fails.
pub fn test_certs() -> tempfile::TempDir {
    let dir = server_dir("certs");
    make_certs(dir.path());
    dir
}

/// A CA and a server certificate for 127.0.0.1 in `dir` (ca.crt, server.crt, server.key).
fn make_certs(dir: &std::path::Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=leasehold test CA",
        ],
    );
    sign_cert(
        dir,
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    );
    // For servers that ask clients for a certificate.
    sign_cert(dir, "client", "/CN=leasehold test client", CLIENT_EXT);
}

/// The extensions of a client certificate.
pub const CLIENT_EXT: &str = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";

/// Whether something answers `GET path` on `127.0.0.1:port` with a 200 whose body contains `needle`.
pub(crate) fn http_ok(port: u16, path: &str, needle: &str) -> bool {
    http_get(port, path).is_some_and(|(code, body)| code == 200 && body.contains(needle))
}

/// A minimal HTTP/1.1 GET on loopback: (status, body), if the server answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(port, "GET", path, &[], "")
}

/// A minimal HTTP/1.1 request on loopback (`Connection: close`): (status, body), if the server
/// answers. `headers` are extra `(name, value)` pairs.
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    let mut s = connect_loopback(port)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Some((code, body))
}

/// Decodes a chunked HTTP body.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A single-member etcd on free client and peer ports in a temp dir, stopped (SIGKILL by PID) on
/// drop.
#[derive(Debug)]
pub struct EtcdServer {
    /// Its client port.
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts etcd and waits until `/health` says it is healthy. A start that fails (etcd exits,
    /// say because another process took one of its ports between [`free_port`] and its bind, or
    /// stays unhealthy for 20 s) is logged on stderr and tried again on new ports, three times in
    /// all.
    ///
    /// # Panics
    /// When `etcd` is missing, or none of the three starts comes up; the message has each
    /// start's failure and the end of its log.
    pub fn start() -> Self {
        in_three_starts("etcd", Self::start_once)
    }

    fn start_once() -> Result<Self, String> {
        let dir = server_dir("etcd");
        let (port, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log_path = dir.path().join("log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("etcd log: {e}"))?;
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "n1", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("n1={peer_url}")])
            .args(["--initial-cluster-state", "new", "--unsafe-no-fsync"])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = spawn(cmd).unwrap_or_else(|e| {
            panic!("cannot start etcd ({e}): install it with `apt-get install etcd-server etcd-client`, or run ./scripts/test which does")
        });
        let up = wait_up(
            &mut child,
            &format!("etcd on ports {port}/{peer}"),
            Duration::from_secs(20),
            Duration::from_millis(20),
            || http_ok(port, "/health", "\"health\":\"true\""),
        );
        if let Err(why) = up {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join("\n");
            return Err(format!("{why}; its log ends:\n{tail}"));
        }
        Ok(EtcdServer {
            port,
            child: Some(child),
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills etcd (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `LEASEHOLD_APISERVER` (a `leasehold-apiserver` program) when set; else builds
/// `leasehold-apiserver` (once per process, a no-op when it is fresh) and returns its path.
fn apiserver_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(bin) = std::env::var_os("LEASEHOLD_APISERVER").filter(|b| !b.is_empty()) {
                return PathBuf::from(bin);
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let path = crate::workspace_bin("leasehold-apiserver");
            // Built in the profile of the running test or benchmark (target/debug or
            // target/release), where `workspace_bin` looks for it.
            let release = path
                .parent()
                .is_some_and(|d| d.file_name().is_some_and(|n| n == "release"));
            let mut args = vec!["build", "--quiet", "-p", "leasehold-apiserver"];
            if release {
                args.push("--release");
            }
            let status = Command::new(cargo)
                .args(&args)
                .status()
                .unwrap_or_else(|e| panic!("cannot run cargo to build leasehold-apiserver: {e}"));
            assert!(
                status.success(),
                "building leasehold-apiserver failed (run from the workspace, or set LEASEHOLD_APISERVER to a leasehold-apiserver program: cargo build -p leasehold-apiserver)"
            );
            path
        })
        .clone()
}

/// `leasehold-apiserver` (the Kubernetes-API-compatible Lease server) on a free port over its own
/// [`EtcdServer`]; both stopped (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct ApiServer {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
    etcd: EtcdServer,
    /// Its extra arguments (to start it again alike).
    args: Vec<String>,
    dir: tempfile::TempDir,
}

/// Starts `leasehold-apiserver` (`bin`) on `port` over `etcd` and waits until `/healthz` answers;
/// an error when it exits or does not answer within 20 s.
fn apiserver_launch(
    bin: &Path,
    port: u16,
    etcd: &EtcdServer,
    args: &[String],
) -> Result<Child, String> {
    let mut cmd = Command::new(bin);
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd", &etcd.url()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut child = spawn(cmd).map_err(|e| format!("cannot start {} ({e})", bin.display()))?;
    wait_up(
        &mut child,
        &format!("leasehold-apiserver on port {port}"),
        Duration::from_secs(20),
        Duration::from_millis(10),
        || http_ok(port, "/healthz", "ok"),
    )
    .map(|()| child)
}

impl ApiServer {
    /// Starts etcd and the API server and waits until `/healthz` answers.
    ///
    /// # Panics
    /// When etcd or the API server cannot start or does not come up within 20 s.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts one with extra arguments (`["--deny", "update"]` to refuse a verb as RBAC would).
    /// An API server that exits before it answers (another process took its port between
    /// [`free_port`] and its bind) is started again on a new port, three times in all.
    pub fn start_with(args: &[&str]) -> Self {
        let etcd = EtcdServer::start();
        let bin = apiserver_bin();
        let dir = server_dir("apiserver");
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let (port, child) = in_three_starts("leasehold-apiserver", || {
            let port = free_port();
            apiserver_launch(&bin, port, &etcd, &args).map(|child| (port, child))
        });
        ApiServer {
            port,
            child: Some(child),
            etcd,
            args,
            dir,
        }
    }

    /// Starts a stopped API server again, on its port, over its etcd (which kept every Lease).
    ///
    /// # Errors
    /// When it does not answer within 20 s (another process took its port, say).
    pub fn start_again(&mut self) -> Result<(), String> {
        if self.child.is_none() {
            let child = apiserver_launch(&apiserver_bin(), self.port, &self.etcd, &self.args)?;
            self.child = Some(child);
        }
        Ok(())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends `sig` to the API server process (SIGSTOP: it hangs, its connections open and silent).
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// The etcd behind it.
    pub fn etcd(&self) -> &EtcdServer {
        &self.etcd
    }

    /// A store URL for namespace `ns` on this server: `k8s://NS?server=http://127.0.0.1:PORT`.
    pub fn store_url(&self, ns: &str) -> String {
        format!("k8s://{ns}?server={}", self.url())
    }

    /// Writes a kubeconfig pointing at this server (namespace `ns`) and returns its path.
    pub fn kubeconfig(&self, ns: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{ns}"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: {ns}\ncurrent-context: test\nusers:\n- name: test\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write kubeconfig: {e}"));
        path
    }

    /// Lease API requests served since start or the last reset, from `/debug/requests`.
    pub fn requests(&self) -> serde_json::Value {
        let (_, body) = http_get(self.port, "/debug/requests")
            .unwrap_or_else(|| panic!("leasehold-apiserver on port {} does not answer", self.port));
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/debug/requests: {e}: {body}"))
    }

    /// Resets the request counters.
    pub fn reset_requests(&self) {
        let _ = http_request(self.port, "DELETE", "/debug/requests", &[], "");
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the API server (SIGKILL) and waits for it; etcd stops on drop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One API server (over one etcd) shared by all tests of this process (each test uses its own
/// namespace or key prefix).
pub fn shared_apiserver() -> &'static ApiServer {
    static SERVER: OnceLock<ApiServer> = OnceLock::new();
    SERVER.get_or_init(ApiServer::start)
}

/// The directory of the newest installed PostgreSQL's programs (`/usr/lib/postgresql/N/bin`).
///
/// # Panics
/// When PostgreSQL is not installed, naming the package.
pub fn postgres_bin() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).unwrap_or_else(|| {
        panic!("PostgreSQL is not installed (no /usr/lib/postgresql/N/bin/initdb): install it with `apt-get install postgresql`, or run ./scripts/test which does")
    })
}

/// The uid and gid the server runs as: the `postgres` user when we are root (PostgreSQL refuses
/// to run as root), else ourselves.
fn postgres_ids() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    // SAFETY: a NUL-terminated name; the returned entry is read at once, before any other
    // getpw* call of this thread.
    let pw = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    assert!(
        !pw.is_null(),
        "no `postgres` user to run PostgreSQL as (apt-get install postgresql creates it)"
    );
    // SAFETY: pw is non-null and points to a valid passwd entry.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// A PostgreSQL server on a free 127.0.0.1 port, in a temp dir the `postgres` user can reach
/// (under /tmp), with `fsync=off`; stopped (SIGKILL by PID) on drop and when this process dies.
#[derive(Debug)]
pub struct PostgresServer {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
    bin: PathBuf,
    /// For a server started with [`PostgresServer::start_tls`]: the directory of its certificates.
    certs: Option<PathBuf>,
    /// Its `-c` settings beyond the common ones (to start it again alike).
    settings: Vec<String>,
    _dir: tempfile::TempDir,
}

/// Starts `postgres` on `port` over the cluster `dir/data` (socket and log in `dir`) and waits
/// until `pg_isready` says it accepts connections; an error with its log when it exits or is not
/// ready within 30 s (the process is then killed and reaped).
fn postgres_launch(
    bin: &Path,
    dir: &Path,
    port: u16,
    settings: &[String],
) -> Result<Child, String> {
    let log = std::fs::File::create(dir.join("log")).map_err(|e| format!("postgres log: {e}"))?;
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string(), "-k"])
        .arg(dir)
        .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        .args(["-c", "full_page_writes=off", "-c", "max_connections=200"])
        .args(settings.iter().flat_map(|s| ["-c", s.as_str()]))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log);
    if let Some((uid, gid)) = postgres_ids() {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    let mut child = spawn(cmd).map_err(|e| format!("cannot start postgres: {e}"))?;
    // `pg_isready`: it accepts connections.
    let ready = || {
        Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    };
    let what = format!("postgres on port {port}");
    wait_up(
        &mut child,
        &what,
        Duration::from_secs(30),
        Duration::from_millis(20),
        ready,
    )
    .map(|()| child)
    .map_err(|why| with_log(&why, &dir.join("log")))
}

/// The roles a TLS server ([`PostgresServer::start_tls`]) has besides `postgres`.
pub mod pg_roles {
    /// Logs in with a client certificate only (`hostssl … cert`; its certificate is
    /// `locker.crt` / `locker.key` in [`super::PostgresServer::cert`]'s directory).
    pub const CERT: &str = "locker";
    /// Logs in with a password only, by SCRAM-SHA-256 (`hostssl … scram-sha-256`).
    pub const SCRAM: &str = "scrammer";
    /// The password of [`SCRAM`].
    pub const SCRAM_PASSWORD: &str = "s3cret-pass";
}

impl PostgresServer {
    /// Runs `initdb` and starts `postgres`, waiting until `pg_isready` says it accepts
    /// connections.
    ///
    /// # Panics
    /// When PostgreSQL is missing, `initdb` fails, or the server is not ready within 30 s.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// As [`PostgresServer::start`], with TLS on (a CA and certificates of the test kit's own)
    /// and required: `pg_hba.conf` refuses every TCP connection without TLS. Over TLS, `postgres`
    /// is trusted, [`pg_roles::CERT`] needs a client certificate the CA signed, and
    /// [`pg_roles::SCRAM`] a password (both superusers). [`PostgresServer::url`] then gives a
    /// `sslmode=verify-full` URL.
    ///
    /// # Panics
    /// As [`PostgresServer::start`], and when openssl fails.
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        let bin = postgres_bin();
        let ids = postgres_ids();
        let dir = server_dir("pg");
        let as_server = |cmd: &mut Command| {
            use std::os::unix::process::CommandExt;
            if let Some((uid, gid)) = ids {
                cmd.uid(uid).gid(gid);
            }
        };
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", dir.path().display()));
        }
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .current_dir(dir.path());
        as_server(&mut initdb);
        let out = initdb
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb: {e}"));
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut settings: Vec<String> = vec![];
        let certs = tls.then(|| {
            let certs = dir.path().join("certs");
            std::fs::create_dir(&certs).unwrap_or_else(|e| panic!("mkdir certs: {e}"));
            make_certs(&certs);
            sign_cert(
                &certs,
                "locker",
                &format!("/CN={}", pg_roles::CERT),
                CLIENT_EXT,
            );
            // The server's key: the server's own, readable by it alone (PostgreSQL checks).
            let key = certs.join("server.key");
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap_or_else(|e| panic!("chmod server.key: {e}"));
            for path in [certs.clone(), key] {
                if let Some((uid, gid)) = ids {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                        .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
                }
            }
            for (name, file) in [
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
                ("ssl_ca_file", "ca.crt"),
            ] {
                settings.push(format!("{name}={}", certs.join(file).display()));
            }
            settings.push("ssl=on".into());
            let hba = format!(
                "local all all trust\n\
                 hostssl all {cert} 127.0.0.1/32 cert\n\
                 hostssl all {scram} 127.0.0.1/32 scram-sha-256\n\
                 hostssl all all 127.0.0.1/32 trust\n\
                 host all all 127.0.0.1/32 reject\n",
                cert = pg_roles::CERT,
                scram = pg_roles::SCRAM,
            );
            std::fs::write(data.join("pg_hba.conf"), hba)
                .unwrap_or_else(|e| panic!("write pg_hba.conf: {e}"));
            certs
        });
        // Up to three starts, each on a new port: another process can take a port between
        // `free_port` and the server's bind. The data directory is kept.
        let started = in_three_starts("postgres", || {
            let port = free_port();
            postgres_launch(&bin, dir.path(), port, &settings).map(|child| (port, child))
        });
        let (port, child) = started;
        let server = PostgresServer {
            port,
            child: Some(child),
            bin,
            certs,
            settings,
            _dir: dir,
        };
        if tls {
            let roles = format!(
                "CREATE ROLE {} LOGIN SUPERUSER; CREATE ROLE {} LOGIN SUPERUSER PASSWORD '{}'",
                pg_roles::CERT,
                pg_roles::SCRAM,
                pg_roles::SCRAM_PASSWORD
            );
            assert!(
                server.psql("postgres", &roles).is_some(),
                "cannot create the TLS server's roles"
            );
        }
        server
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`; on a TLS server
    /// ([`PostgresServer::start_tls`]), with `?sslmode=verify-full&sslrootcert=…/ca.crt`.
    pub fn url(&self, db: &str) -> String {
        let plain = format!("postgres://postgres@127.0.0.1:{}/{db}", self.port);
        match &self.certs {
            Some(_) => format!(
                "{plain}?sslmode=verify-full&sslrootcert={}",
                self.cert("ca.crt").display()
            ),
            None => plain,
        }
    }

    /// The directory of the server's Unix socket (`.s.PGSQL.PORT`): a URL reaches it with
    /// `?host=DIR&port=PORT`.
    pub fn socket_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// The file `name` of a TLS server's certificates directory (`ca.crt`, `server.crt`,
    /// `client.crt` / `client.key` signed by the CA for a subject no role has, `locker.crt` /
    /// `locker.key` for [`pg_roles::CERT`]).
    ///
    /// # Panics
    /// On a server started without TLS.
    pub fn cert(&self, name: &str) -> PathBuf {
        match &self.certs {
            Some(dir) => dir.join(name),
            None => panic!("the server was started without TLS"),
        }
    }

    /// Creates a fresh database with a random name and returns its URL.
    pub fn fresh_db(&self) -> String {
        let name = format!("t{:016x}", fastrand::u64(..));
        let out = Command::new(self.bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", &name])
            .output()
            .unwrap_or_else(|e| panic!("cannot run createdb: {e}"));
        assert!(
            out.status.success(),
            "createdb {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.url(&name)
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server with a fast shutdown (SIGINT: it ends every session, writes a checkpoint
    /// and exits) and waits for it; [`PostgresServer::start_again`] brings it back.
    pub fn stop_fast(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = libc::pid_t::try_from(c.id()) {
                // SAFETY: kill(2) on our own child's pid (not yet reaped).
                unsafe { libc::kill(pid, libc::SIGINT) };
            }
            let _ = c.wait();
        }
    }

    /// Starts a stopped server again, on its port and over its data.
    ///
    /// # Errors
    /// When it does not accept connections within 30 s (another process took its port, say).
    pub fn start_again(&mut self) -> Result<(), String> {
        if self.child.is_none() {
            let child = postgres_launch(&self.bin, self._dir.path(), self.port, &self.settings)?;
            self.child = Some(child);
        }
        Ok(())
    }

    /// Runs `sql` in database `db` with `psql` as the `postgres` user: its output, unaligned and
    /// without headers (one value per line), or `None` when `psql` fails.
    pub fn psql(&self, db: &str, sql: &str) -> Option<String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db, "-XAtc", sql])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Sends `sig` to every process of the server: the postmaster and its children (one backend
    /// per connection, the background workers), so that SIGSTOP hangs the whole server.
    pub fn signal_all(&self, sig: i32) {
        let Some(postmaster) = self.pid() else {
            return;
        };
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // `pid (comm) state ppid …`: the parent is the second field after the comm.
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        for pid in pids {
            // SAFETY: kill(2) on the server's processes.
            unsafe {
                libc::kill(pid as i32, sig);
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One PostgreSQL server shared by all tests of this process (each test uses its own database).
pub fn shared_postgres() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::start)
}

/// One TLS PostgreSQL server ([`PostgresServer::start_tls`]) shared by all tests of this process.
pub fn shared_postgres_tls() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::start_tls)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A port another process holds makes the start fail at once, with the server's own words
    /// (and [`RedisServer::start`] then tries a new port).
    #[test]
    fn a_taken_port_fails_the_start_with_the_servers_log() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let started = Instant::now();
        let err = RedisServer::launch_on(port, Tls::Off, &[]).expect_err("the port is taken");
        assert!(err.contains("exited"), "{err}");
        assert!(
            err.to_lowercase().contains("address already in use"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        assert!(RedisServer::start().ping());
    }
}
