//! A Redis Sentinel deployment: a primary, its replica and three sentinels, plain, with a
//! sentinel password, or over TLS.

use crate::certs::make_certs;
use crate::error::{Error, Result};
use crate::process::{
    free_port, in_three_starts, kill, poll_until, server_dir, spawn, wait_up, Pausable,
};
use crate::redis::{command_as, command_over_tls, RedisServer, Tls};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
    ca: Option<PathBuf>,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl SentinelServer {
    /// Sends one command (after `AUTH` if the sentinel has a password); the raw first reply (over
    /// TLS: `redis-cli`'s output).
    pub fn command(&self, args: &[&str]) -> Option<String> {
        match &self.ca {
            Some(ca) => command_over_tls(self.port, ca, self.password.as_deref(), args),
            None => command_as(self.port, self.password.as_deref(), args),
        }
    }
}

/// Paused, a sentinel stops answering and its connections stay open, as behind a partition.
impl Pausable for SentinelServer {
    fn process(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

impl SentinelSet {
    /// Starts the servers and sentinels and waits until the replica has synced and every sentinel
    /// knows the replica and the two other sentinels (so a failover can be agreed).
    ///
    /// # Errors
    /// When a process cannot start or the deployment does not settle within 30 s.
    pub fn start() -> Result<Self> {
        Self::start_with_password(None)
    }

    /// [`SentinelSet::start`] with sentinels that require `password` (`requirepass`, as Helm
    /// charts set them up); [`SentinelSet::url`] then carries it as `?sentinel_pass=`.
    ///
    /// # Errors
    /// As [`SentinelSet::start`].
    pub fn start_with_password(password: Option<&str>) -> Result<Self> {
        Self::launch(password, false)
    }

    /// [`SentinelSet::start`] over TLS only: data servers (replicating over TLS) and sentinels
    /// listen on TLS ports, with certificates from one test CA; [`SentinelSet::url`] is then
    /// `rediss+sentinel://…?ca=CA`.
    ///
    /// # Errors
    /// As [`SentinelSet::start`], and when openssl is missing or fails.
    pub fn start_tls() -> Result<Self> {
        Self::launch(None, true)
    }

    fn launch(password: Option<&str>, tls: bool) -> Result<Self> {
        let certs = match tls {
            true => {
                let certs = server_dir("sentinel-certs")?;
                make_certs(certs.path())?;
                Some(certs)
            }
            false => None,
        };
        let data_server = || match &certs {
            Some(c) => RedisServer::launch(Tls::From(c.path()), &["--tls-replication", "yes"]),
            None => RedisServer::start(),
        };
        let primary = data_server()?;
        let replica = data_server()?;
        let primary_port = primary.port.to_string();
        if !replica
            .command(&["REPLICAOF", "127.0.0.1", &primary_port])
            .is_some_and(|r| r.starts_with("+OK") || r.starts_with("OK"))
        {
            return Err(Error::Setup(format!(
                "the server on port {} refused REPLICAOF",
                replica.port
            )));
        }
        // Each up to three times on a new port (another process can take one between `free_port`
        // and the sentinel's bind), waiting until it answers `PING`.
        let sentinels = (0..3)
            .map(|_| in_three_starts("redis-server --sentinel", || {
                let dir = server_dir("sentinel")?;
                let port = free_port()?;
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
                std::fs::write(&conf, text).map_err(Error::io("write sentinel.conf"))?;
                let mut cmd = Command::new("redis-server");
                cmd.arg(&conf)
                    .args(["--sentinel", "--daemonize", "no", "--loglevel", "warning"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit());
                let mut child = spawn(cmd).map_err(|e| {
                    Error::Missing(format!("cannot start redis-server --sentinel ({e}): install redis-server, or run ./scripts/test which does"))
                })?;
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
                up.map(|()| sentinel).map_err(Error::NotStarted)
            }))
            .collect::<Result<Vec<SentinelServer>>>()?;
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
        )?;
        Ok(set)
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

    /// Asks sentinel `i` for a failover (`SENTINEL FAILOVER`: the replica promoted, the old
    /// primary made its replica; replication is asynchronous). It returns at once: see
    /// [`SentinelSet::primary_port`] for when it is done.
    pub fn fail_over(&self, i: usize) {
        if let Some(s) = self.sentinels.get(i) {
            let _ = s.command(&["SENTINEL", "FAILOVER", SENTINEL_MASTER]);
        }
    }

    /// The data server listening on `port`.
    pub fn server(&self, port: u16) -> Option<&RedisServer> {
        self.servers.iter().find(|s| s.port == port)
    }

    /// Waits until every other data server has received what the one on `primary` had written
    /// ([`RedisServer::replicated_to`]).
    ///
    /// # Errors
    /// When `primary` is not one of the set's servers, or a replica lags 10 s.
    pub async fn replicated_from(&self, primary: u16) -> Result<()> {
        let from = self.server(primary).ok_or_else(|| {
            Error::Setup(format!("no server of the set listens on port {primary}"))
        })?;
        for replica in self.servers.iter().filter(|s| s.port != primary) {
            from.replicated_to(replica).await?;
        }
        Ok(())
    }
}
