//! The servers `leasehold torture` starts itself (the launchers of the `leasehold-servers` crate,
//! the same the test suite runs; in a build with the `torture` feature, on by default), their
//! `restart` fault, and what each store promises under each fault.
//!
//! What `restart` does per kind:
//! * `redis` — the server (no persistence) killed and started again empty on its port;
//! * `redis-sentinel` — a Sentinel failover (`SENTINEL FAILOVER`: the replica promoted, the old
//!   primary made its replica), replication asynchronous;
//! * `redis-cluster` — a manual failover of one shard (`CLUSTER FAILOVER` on its replica, which
//!   waits until the replica has everything the primary had);
//! * `redlock` — one node of three (always the same) killed and started again empty;
//! * `etcd` — the Raft leader of a 3-member cluster killed (SIGKILL), then started again over its
//!   data, advertising the same peer URL (its proxy's when the run partitions: see below);
//! * `postgres` — a fast shutdown (SIGINT) and a start over the same data;
//! * `k8s` — the API server (`leasehold-apiserver`) killed and started again over its etcd;
//! * `gcs`, `s3`, `azure` — the emulator (in memory: a real restart would lose every object)
//!   stopped (SIGSTOP) for 1.5 TTL, then continued: a hung server.
//!
//! A server is down (or hung) for up to one TTL; failovers have no down time of their own.
//!
//! For a run with the `partition` fault, the etcd cluster's members reach each other through the
//! harness's peer proxies ([`Peers`]), so that the fault can cut a member from its peers too.
//!
//! `s3` runs moto behind the launchers' serialising proxy (one request in flight to moto at a
//! time): moto checks a conditional PUT and writes it in two steps, so two concurrent PUTs on one
//! ETag can both be accepted, which S3 refuses. `restart` stops moto itself, not the proxy.
//! `azure` puts Azurite's endpoint in the store URL (`?endpoint=`, credentials from the
//! environment), so that `partition` can proxy it.

use super::network::Peers;
use crate::cli::Fault;
#[cfg(feature = "torture")]
use crate::exit::ERROR;
use crate::exit::{Failure, USAGE};
#[cfg(feature = "torture")]
use leasehold_servers::{
    redlock_url, ApiServer, EtcdCluster, GcsServer, MotoServer, PostgresServer, RedisCluster,
    RedisServer, SentinelSet, SENTINEL_MASTER,
};
use std::path::Path;
#[cfg(feature = "torture")]
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The kinds `leasehold torture` starts the servers of (file and memory need none).
pub(crate) const KINDS: &[&str] = &[
    "file",
    "memory",
    "redis",
    "redis-sentinel",
    "redis-cluster",
    "redlock",
    "etcd",
    "postgres",
    "k8s",
    "gcs",
    "s3",
    "azure",
];

/// What a store promises under a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Promise {
    /// No two holders inside one key's section while the earlier one's lease is valid.
    pub(crate) exclusion: bool,
    /// Every grant's fence above the key's highest.
    pub(crate) fences: bool,
}

/// What each store promises under `fault` (from its page of the documentation): every store keeps
/// both under `none`, `kill`, `stop`, `partition` and `lost-answer`; under `restart`, a Redis server restarted empty and an
/// asynchronous Sentinel failover lose grants and fence counters, so neither is promised.
pub(crate) fn promises(kind: &str, fault: Fault) -> Promise {
    let lost = fault == Fault::Restart && matches!(kind, "redis" | "redis-sentinel");
    Promise {
        exclusion: !lost,
        fences: !lost,
    }
}

/// The servers of one run.
#[derive(Debug)]
enum Running {
    /// None started here: file, memory, or `--store URL`.
    Nothing,
    #[cfg(feature = "torture")]
    Redis(RedisServer),
    #[cfg(feature = "torture")]
    Sentinel(SentinelSet),
    #[cfg(feature = "torture")]
    Cluster(RedisCluster),
    #[cfg(feature = "torture")]
    Redlock(Vec<RedisServer>),
    /// Its members driven from a blocking thread (each waits for its peers, whose traffic may go
    /// through `peers`, proxies served by this process's runtime).
    #[cfg(feature = "torture")]
    Etcd {
        cluster: Arc<Mutex<EtcdCluster>>,
        peers: Option<Peers>,
    },
    #[cfg(feature = "torture")]
    Postgres(PostgresServer),
    #[cfg(feature = "torture")]
    K8s(ApiServer),
    #[cfg(feature = "torture")]
    Gcs(GcsServer),
    #[cfg(feature = "torture")]
    S3(MotoServer),
    #[cfg(all(feature = "torture", feature = "azure"))]
    Azure(leasehold_servers::AzuriteServer),
}

/// The store of one run: its URL, the environment its clients need, and the servers started here.
#[derive(Debug)]
pub(crate) struct Stores {
    url: String,
    env: Vec<(String, String)>,
    running: Running,
}

impl Stores {
    /// The store for `kind`: `url` when given (a server the user runs), else servers started
    /// here, in `dir` for the file store; an etcd cluster's members behind [`Peers`] when
    /// `partition` (the run will partition them).
    ///
    /// # Errors
    /// A usage error for an unknown kind, or for a kind whose servers this build cannot start
    /// (without the `torture` feature); an error naming the server and what to install (or to
    /// pass `--store URL`) when one cannot start.
    pub(crate) async fn start(
        kind: &str,
        url: Option<&str>,
        dir: &Path,
        partition: bool,
    ) -> Result<Stores, Failure> {
        let plain = |url: String| Stores {
            url,
            env: vec![],
            running: Running::Nothing,
        };
        match (url, kind) {
            (Some(u), _) => Ok(plain(u.to_owned())),
            (None, "file") => Ok(plain(format!("file://{}", dir.join("locks").display()))),
            (None, "memory") => Ok(plain("memory://".to_owned())),
            (None, k) if !KINDS.contains(&k) => Err(Failure::new(
                USAGE,
                format!(
                    "torture {k} needs --store URL of a server you run (started here: {})",
                    KINDS.join(", ")
                ),
            )),
            #[cfg(feature = "torture")]
            (None, k) => launch(k, partition).await,
            #[cfg(not(feature = "torture"))]
            (None, k) => {
                let _ = partition;
                Err(Failure::new(
                    USAGE,
                    format!(
                        "torture {k} starts its servers itself, and this leasehold was built without its server launchers (the `torture` feature): pass --store URL of a server you run, or install leasehold with its default features"
                    ),
                ))
            }
        }
    }

    /// The store URL the clients open.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The environment the clients need besides this process's (credentials of an emulator).
    pub(crate) fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The proxies between the members of a cluster started here, when it has them.
    pub(crate) fn peers(&self) -> Option<&Peers> {
        match &self.running {
            #[cfg(feature = "torture")]
            Running::Etcd { peers, .. } => peers.as_ref(),
            _ => None,
        }
    }

    /// Whether `restart` can be injected: the servers were started here.
    pub(crate) fn restartable(&self) -> bool {
        !matches!(self.running, Running::Nothing)
    }

    /// Injects one `restart` (see the module documentation), with the down time drawn from `rng`
    /// (up to one `ttl`).
    ///
    /// # Errors
    /// When a server does not come back.
    #[cfg(not(feature = "torture"))]
    pub(crate) async fn restart(
        &mut self,
        _rng: &mut fastrand::Rng,
        _ttl: Duration,
    ) -> Result<(), Failure> {
        match self.running {
            Running::Nothing => Ok(()),
        }
    }

    /// Stops every server started here.
    pub(crate) fn stop(self) {
        // Each launcher's value stops its processes (SIGKILL by PID) when dropped (a build
        // without the launchers has nothing to stop).
        let Stores { running, .. } = self;
        #[cfg_attr(not(feature = "torture"), allow(clippy::drop_non_drop))]
        drop(running);
    }
}

/// Starts the servers of `kind` (one of [`KINDS`] but file and memory); an etcd cluster's members
/// behind [`Peers`] when `partition`.
#[cfg(feature = "torture")]
async fn launch(kind: &str, partition: bool) -> Result<Stores, Failure> {
    let plain = |url: String, running| Stores {
        url,
        env: vec![],
        running,
    };
    let env = |pairs: Vec<(&str, String)>| {
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect::<Vec<_>>()
    };
    Ok(match kind {
        "redis" => {
            let s = started("redis-server", RedisServer::start())?;
            plain(s.url(), Running::Redis(s))
        }
        "redis-sentinel" => {
            let s = started("a Redis Sentinel deployment", SentinelSet::start())?;
            plain(s.url(), Running::Sentinel(s))
        }
        "redis-cluster" => {
            let s = started("a Redis Cluster", RedisCluster::start())?;
            plain(s.url(), Running::Cluster(s))
        }
        "redlock" => {
            let nodes = started(
                "redis-server (Redlock nodes)",
                (0..3)
                    .map(|_| RedisServer::start())
                    .collect::<Result<Vec<_>, _>>(),
            )?;
            plain(redlock_url(&nodes), Running::Redlock(nodes))
        }
        "etcd" => {
            let peers = if partition {
                Some(Peers::new(3).await.map_err(|e| Failure::new(ERROR, e))?)
            } else {
                None
            };
            let behind = peers
                .as_ref()
                .map(|p| (p.ports.clone(), p.pids.clone(), p.aimer()));
            // Off this thread: the members come up only if the peer proxies forward.
            let s = tokio::task::spawn_blocking(move || {
                started(
                    "an etcd cluster",
                    match behind {
                        Some((ports, pids, aim)) => {
                            EtcdCluster::start_with_peer_proxies(&ports, &pids, aim)
                        }
                        None => EtcdCluster::start(3),
                    },
                )
            })
            .await
            .map_err(|e| Failure::new(ERROR, format!("starting etcd: {e}")))??;
            plain(
                s.url(),
                Running::Etcd {
                    cluster: Arc::new(Mutex::new(s)),
                    peers,
                },
            )
        }
        "postgres" => {
            let (s, url) = started(
                "PostgreSQL",
                PostgresServer::start().and_then(|s| {
                    let url = s.fresh_db()?;
                    Ok((s, url))
                }),
            )?;
            plain(url, Running::Postgres(s))
        }
        "k8s" => {
            let s = started("leasehold-apiserver over etcd", ApiServer::start())?;
            plain(s.store_url("torture"), Running::K8s(s))
        }
        "gcs" => {
            let s = started("fake-gcs-server", GcsServer::start())?;
            plain(s.store_url("torture/"), Running::Gcs(s))
        }
        "s3" => {
            let (s, url) = started(
                "moto (S3)",
                MotoServer::start_serialised().and_then(|s| {
                    let url = s.url("torture", "torture/")?;
                    Ok((s, url))
                }),
            )?;
            Stores {
                url,
                env: env(s.env()),
                running: Running::S3(s),
            }
        }
        #[cfg(feature = "azure")]
        "azure" => {
            let s = started("Azurite", leasehold_servers::AzuriteServer::start())?;
            let store = leasehold::stores::azure::AzureStore::connect({
                let mut o = leasehold::stores::azure::AzureOptions::new("torture");
                o.prefix = "torture/".into();
                o.endpoint = Some(s.endpoint());
                o.credentials = Some(leasehold::stores::azure::AzureCredentials::new(
                    leasehold::stores::azure::DEV_ACCOUNT.0,
                    leasehold::stores::azure::DEV_ACCOUNT.1,
                ));
                o
            })?;
            store
                .create_container()
                .await
                .map_err(|e| Failure::new(ERROR, format!("Azurite: {e}")))?;
            Stores {
                url: format!("az://torture/torture/?endpoint={}", s.endpoint()),
                env: env(s.env()),
                running: Running::Azure(s),
            }
        }
        other => {
            return Err(Failure::new(
                USAGE,
                format!("this leasehold was built without the store of torture {other}"),
            ))
        }
    })
}

#[cfg(feature = "torture")]
impl Stores {
    /// Injects one `restart` (see the module documentation), with the down time drawn from `rng`
    /// (up to one `ttl`).
    ///
    /// # Errors
    /// When a server does not come back.
    pub(crate) async fn restart(
        &mut self,
        rng: &mut fastrand::Rng,
        ttl: Duration,
    ) -> Result<(), Failure> {
        let down = ttl.mul_f64(rng.f64());
        match &mut self.running {
            Running::Nothing => {}
            Running::Redis(s) => {
                let port = s.port;
                s.stop();
                tokio::time::sleep(down).await;
                *s = started("redis-server", RedisServer::start_on(port))?;
            }
            Running::Redlock(nodes) => {
                let port = nodes[0].port;
                nodes[0].stop();
                tokio::time::sleep(down).await;
                nodes[0] = started("redis-server (Redlock node)", RedisServer::start_on(port))?;
            }
            Running::Sentinel(set) => {
                let before = set.primary_port();
                let _ = set.sentinels[rng.usize(..set.sentinels.len())].command(&[
                    "SENTINEL",
                    "FAILOVER",
                    SENTINEL_MASTER,
                ]);
                settle("the Sentinel failover", || {
                    let now = set.primary_port();
                    now.is_some() && now != before
                })
                .await?;
            }
            Running::Cluster(cluster) => {
                let primaries: Vec<u16> = cluster
                    .nodes
                    .iter()
                    .filter(|n| n.command(&["ROLE"]).is_some_and(|r| r.contains("master")))
                    .map(|n| n.port)
                    .collect();
                if primaries.is_empty() {
                    return Err(Failure::new(ERROR, "the Redis Cluster has no primary"));
                }
                let primary = primaries[rng.usize(..primaries.len())];
                let replica = cluster.replicas_of(primary).first().map(|r| r.port);
                let Some(replica) = replica else {
                    return Err(Failure::new(
                        ERROR,
                        format!("the Redis Cluster primary on port {primary} has no replica"),
                    ));
                };
                let node = |port: u16| cluster.nodes.iter().find(|n| n.port == port);
                // A manual failover the primary does not join in time is aborted by Redis
                // (seen about once in a hundred under load): asked again, up to three times.
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    let _ = node(replica).and_then(|n| n.command(&["CLUSTER", "FAILOVER"]));
                    let done = settle("the Redis Cluster failover", || {
                        node(replica)
                            .and_then(|n| n.command(&["ROLE"]))
                            .is_some_and(|r| r.contains("master"))
                            && cluster.settled()
                    })
                    .await;
                    match done {
                        Ok(()) => break,
                        Err(e) if attempts >= 3 => return Err(e),
                        Err(_) => {}
                    }
                }
            }
            Running::Etcd { cluster, .. } => {
                let (leader, live) =
                    on_etcd(cluster, |c| (c.leader(), c.live().collect::<Vec<_>>())).await?;
                let i = match leader {
                    Some(i) => i,
                    None if live.is_empty() => {
                        return Err(Failure::new(ERROR, "etcd has no member running"))
                    }
                    None => live[rng.usize(..live.len())],
                };
                on_etcd(cluster, move |c| c.kill(i)).await?;
                tokio::time::sleep(down).await;
                on_etcd(cluster, move |c| c.restart(i))
                    .await?
                    .map_err(|e| Failure::new(ERROR, format!("etcd did not restart: {e}")))?;
            }
            Running::Postgres(s) => {
                s.stop_fast();
                tokio::time::sleep(down).await;
                s.start_again()
                    .map_err(|e| Failure::new(ERROR, format!("PostgreSQL did not restart: {e}")))?;
            }
            Running::K8s(s) => {
                s.stop();
                tokio::time::sleep(down).await;
                s.start_again().map_err(|e| {
                    Failure::new(ERROR, format!("leasehold-apiserver did not restart: {e}"))
                })?;
            }
            Running::Gcs(s) => hang(|sig| s.signal(sig), ttl).await,
            Running::S3(s) => hang(|sig| signal(s.pid(), sig), ttl).await,
            #[cfg(feature = "azure")]
            Running::Azure(s) => hang(|sig| signal(s.pid(), sig), ttl).await,
        }
        Ok(())
    }
}

/// Runs `f` on the etcd cluster from a blocking thread, leaving this one to serve the peer
/// proxies meanwhile.
#[cfg(feature = "torture")]
async fn on_etcd<T: Send + 'static>(
    cluster: &Arc<Mutex<EtcdCluster>>,
    f: impl FnOnce(&mut EtcdCluster) -> T + Send + 'static,
) -> Result<T, Failure> {
    let cluster = Arc::clone(cluster);
    tokio::task::spawn_blocking(move || f(&mut cluster.lock().unwrap_or_else(|e| e.into_inner())))
        .await
        .map_err(|e| Failure::new(ERROR, format!("etcd: {e}")))
}

/// What the server `kind` started here is, where the kind does not say it (`url`: `--store`,
/// none started here), for the run's output.
pub(crate) fn note(kind: &str, url: Option<&str>) -> Option<&'static str> {
    (url.is_none() && kind == "s3").then_some(
        "s3: moto behind the harness's serialising proxy (one request in flight to moto at a time: moto alone can accept two concurrent writes on one ETag)",
    )
}

/// Stops a server (SIGSTOP) for 1.5 `ttl`, then continues it (SIGCONT).
#[cfg(feature = "torture")]
async fn hang(signal: impl Fn(i32), ttl: Duration) {
    signal(libc::SIGSTOP);
    tokio::time::sleep(ttl * 3 / 2).await;
    signal(libc::SIGCONT);
}

/// Sends `sig` to the process `pid` (a server started here, not yet reaped).
#[cfg(feature = "torture")]
fn signal(pid: Option<u32>, sig: i32) {
    if let Some(pid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: kill(2) on a child of this process, which its launcher has not reaped.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Waits until `done` holds, for up to 10 s.
#[cfg(feature = "torture")]
async fn settle(what: &str, mut done: impl FnMut() -> bool) -> Result<(), Failure> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        if tokio::time::Instant::now() >= until {
            return Err(Failure::new(
                ERROR,
                format!("{what} did not complete within 10 s"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A launcher's server, or an error naming `what` with the launcher's message (what to install,
/// or which variable to set).
#[cfg(feature = "torture")]
fn started<T>(what: &str, result: Result<T, leasehold_servers::Error>) -> Result<T, Failure> {
    result.map_err(|e| {
        Failure::new(
            ERROR,
            format!("cannot start {what}: {e} (or pass --store URL of a server you run)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "torture")]
    #[test]
    fn a_launcher_error_is_an_error_naming_the_server() {
        let e = started::<u8>(
            "redis-server",
            Err(leasehold_servers::Error::Missing(
                "cannot start redis-server: install it".into(),
            )),
        )
        .unwrap_err();
        assert_eq!(e.code, ERROR);
        assert!(
            e.message
                .contains("cannot start redis-server: cannot start redis-server: install it"),
            "{e}"
        );
        assert!(e.message.contains("--store URL"), "{e}");
    }

    #[test]
    fn only_a_store_that_loses_data_on_restart_is_excused() {
        for kind in KINDS {
            for fault in [
                Fault::None,
                Fault::Kill,
                Fault::Stop,
                Fault::Partition,
                Fault::LostAnswer,
            ] {
                assert_eq!(
                    promises(kind, fault),
                    Promise {
                        exclusion: true,
                        fences: true
                    }
                );
            }
        }
        assert!(!promises("redis", Fault::Restart).exclusion);
        assert!(!promises("redis-sentinel", Fault::Restart).fences);
        assert!(promises("etcd", Fault::Restart).fences);
    }
}
