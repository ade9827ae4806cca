//! A Redis Cluster: three primaries and a replica of each, plain or over TLS.

use crate::certs::make_certs;
use crate::error::{Error, Result};
use crate::process::{poll_until, server_dir};
use crate::redis::{RedisServer, Tls};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    /// # Errors
    /// When a node cannot start, `redis-cli --cluster create` fails, or the cluster does not
    /// settle within 30 s.
    pub fn start() -> Result<Self> {
        Self::launch(false)
    }

    /// [`RedisCluster::start`] with nodes that speak only TLS, to clients and to each other
    /// (`--tls-cluster yes`, `--tls-replication yes`), all with one CA and server certificate;
    /// [`RedisCluster::url`] then gives `rediss+cluster://…?ca=…`.
    ///
    /// # Errors
    /// As [`RedisCluster::start`], and when openssl is missing or fails.
    pub fn start_tls() -> Result<Self> {
        Self::launch(true)
    }

    fn launch(tls: bool) -> Result<Self> {
        let certs = server_dir("cluster-certs")?;
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
            make_certs(certs.path())?;
            config.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
            Tls::From(certs.path())
        } else {
            Tls::Off
        };
        let nodes = (0..6)
            .map(|_| RedisServer::launch(mode, &config))
            .collect::<Result<Vec<RedisServer>>>()?;
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
            .map_err(|e| Error::Missing(format!("cannot run redis-cli ({e}): install redis-tools, or run ./scripts/test which does")))?;
        if !out.status.success() {
            return Err(Error::Setup(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let cluster = RedisCluster {
            nodes,
            _certs: certs,
        };
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || cluster.settled() && cluster.first_three_primaries(),
            || "the Redis Cluster did not settle within 30 s".into(),
        )?;
        Ok(cluster)
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

    /// The ports of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.command(&["ROLE"]).is_some_and(|r| r.contains("master")))
            .map(|n| n.port)
            .collect()
    }

    /// Asks the node on `replica` to take over from its primary (`CLUSTER FAILOVER`, which
    /// waits until the replica has everything the primary had). It returns at once: the node is
    /// primary once [`RedisCluster::is_primary`] says so.
    pub fn fail_over_to(&self, replica: u16) {
        if let Some(n) = self.nodes.iter().find(|n| n.port == replica) {
            let _ = n.command(&["CLUSTER", "FAILOVER"]);
        }
    }

    /// Whether the node on `port` is a primary now.
    pub fn is_primary(&self, port: u16) -> bool {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.command(&["ROLE"]))
            .is_some_and(|r| r.contains("master"))
    }

    /// The node on `port`, to stop or restart.
    pub fn node_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|n| n.port == port)
    }
}
