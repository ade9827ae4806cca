//! `redis-server`: a plain server, over TLS (optionally asking clients for a certificate), with
//! ACL users; and the raw RESP client the launchers probe Redis and Sentinel with.

use crate::certs::make_certs;
use crate::error::{Error, Result};
use crate::process::{
    connect_loopback, free_port, in_three_starts, kill, server_dir, spawn, wait_up, with_log,
    Pausable,
};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
pub(crate) enum Tls<'a> {
    Off,
    /// A fresh CA and server certificate in its directory.
    Fresh,
    /// The CA and server certificate of this directory (shared by a cluster's nodes).
    From(&'a Path),
}

/// A `redis-server` on a free port (and a Unix socket in its directory) with no persistence,
/// stopped (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct RedisServer {
    /// Its port.
    pub port: u16,
    pub(crate) tls: bool,
    /// It asks clients for a certificate.
    mtls: bool,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Errors
    /// When `redis-server` is missing or does not come up within 10 s (in three starts, each on
    /// a new port).
    pub fn start() -> Result<Self> {
        Self::launch(Tls::Off, &[])
    }

    /// Starts a server on `port` (to restart one in place).
    ///
    /// # Errors
    /// As [`RedisServer::start`], after one start.
    pub fn start_on(port: u16) -> Result<Self> {
        Self::launch_on(port, Tls::Off, &[])
    }

    /// Starts a server with ACL users besides the default one (which stays usable without a
    /// password: [`RedisServer::ping`] and [`RedisServer::command`] use it); each entry is a
    /// `user` line of `redis.conf`, e.g. [`LOCKER_ACL`].
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_with_users(users: &[&str]) -> Result<Self> {
        let config: Vec<&str> = users
            .iter()
            .flat_map(|u| std::iter::once("--user").chain(u.split(' ')))
            .collect();
        Self::launch(Tls::Off, &config)
    }

    /// Starts a server that speaks only TLS, with a fresh CA and server certificate made by
    /// `openssl` in its directory; [`RedisServer::url`] then gives `rediss://…?ca=…`.
    ///
    /// # Errors
    /// As [`RedisServer::start`], and when openssl is missing or fails.
    pub fn start_tls() -> Result<Self> {
        Self::launch(Tls::Fresh, &[])
    }

    /// [`RedisServer::start_tls`] with a server that requires a client certificate from its CA
    /// (`tls-auth-clients yes`, Redis's own default); [`RedisServer::url`] then adds `&cert=…&key=…`.
    ///
    /// # Errors
    /// As [`RedisServer::start_tls`].
    pub fn start_mtls() -> Result<Self> {
        let mut server = Self::launch(Tls::Fresh, &["--tls-auth-clients", "yes"])?;
        server.mtls = true;
        Ok(server)
    }

    /// Starts a server on a free port: up to three times, each on a new port (another process
    /// can take a port between [`free_port`] and the server's bind — an outgoing connection's
    /// ephemeral port, from the same range).
    pub(crate) fn launch(tls: Tls<'_>, config: &[&str]) -> Result<Self> {
        in_three_starts("redis-server", || {
            Self::launch_on(free_port()?, tls, config)
        })
    }

    /// Starts a server on `port` and waits until it answers `PING`; an error (with the server's
    /// log) when it exits or does not answer within 10 s.
    pub(crate) fn launch_on(port: u16, tls: Tls<'_>, config: &[&str]) -> Result<Self> {
        let dir = server_dir("redis")?;
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
                            .map_err(Error::io(format!("copy {f}")))?;
                    }
                }
                _ => make_certs(dir.path())?,
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
        let mut child = spawn(cmd).map_err(|e| {
            Error::Missing(format!("cannot start redis-server ({e}): install it with `apt-get install redis-server`, or run ./scripts/test which does"))
        })?;
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
            Err(why) => Err(Error::NotStarted(with_log(
                &why,
                &server.dir.path().join(LOG),
            ))),
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
    /// # Errors
    /// When it has not within 10 s.
    pub async fn synced_as_replica(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.replica_synced() {
            if std::time::Instant::now() >= deadline {
                return Err(Error::Setup(format!(
                    "replica never synced: {}",
                    self.command(&["INFO", "replication"]).unwrap_or_default()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Waits until a client of this server is blocked (in `WAIT`, say: `blocked_clients` of
    /// `INFO clients`).
    ///
    /// # Errors
    /// When none is within 10 s.
    pub async fn a_client_blocked(&self) -> Result<()> {
        let blocked = || {
            let info = self.command(&["INFO", "clients"]).unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !blocked() {
            if std::time::Instant::now() >= deadline {
                return Err(Error::Setup(format!(
                    "no client blocked: {}",
                    self.command(&["INFO", "clients"]).unwrap_or_default()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
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
    /// # Errors
    /// When the primary does not say its offset, or the replica has not reached it within 10 s.
    pub async fn replicated_to(&self, replica: &RedisServer) -> Result<()> {
        let written = self
            .replication_offset("master_repl_offset")
            .ok_or_else(|| {
                Error::Setup(format!(
                    "the primary on port {} does not say its replication offset",
                    self.port
                ))
            })?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while replica
            .replication_offset("slave_repl_offset")
            .is_none_or(|o| o < written)
        {
            if std::time::Instant::now() >= deadline {
                return Err(Error::Setup(format!(
                    "the replica on port {} did not reach offset {written} within 10 s",
                    replica.port
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
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

    /// Kills the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        kill(&mut self.child);
    }

    /// Starts the server again on its port, empty (it keeps nothing on disk), after
    /// [`RedisServer::stop`]: a restart that loses every key.
    ///
    /// # Errors
    /// As [`RedisServer::start_on`].
    pub fn start_again(&mut self) -> Result<()> {
        *self = Self::start_on(self.port)?;
        Ok(())
    }

    /// The server's data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Pausable for RedisServer {
    fn process(&self) -> Option<u32> {
        self.pid()
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
pub(crate) fn command_over_tls(
    port: u16,
    ca: &Path,
    password: Option<&str>,
    args: &[&str],
) -> Option<String> {
    let mut cli = Command::new("redis-cli");
    cli.args(["--tls", "--cacert"])
        .arg(ca)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    // The client certificate next to the CA, for servers that ask for one.
    let dir = ca.parent().unwrap_or(Path::new("."));
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
pub(crate) fn command_as(port: u16, password: Option<&str>, args: &[&str]) -> Option<String> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A port another process holds makes the start fail at once, with the server's own words
    /// (and [`RedisServer::start`] then tries a new port).
    #[test]
    fn a_taken_port_fails_the_start_with_the_servers_log() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let started = Instant::now();
        let err = RedisServer::launch_on(port, Tls::Off, &[]).expect_err("the port is taken");
        assert!(matches!(err, Error::NotStarted(_)), "{err}");
        let err = err.to_string();
        assert!(err.contains("exited"), "{err}");
        assert!(
            err.to_lowercase().contains("address already in use"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        assert!(RedisServer::start().unwrap().ping());
    }
}
