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
use crate::exit::{Failure, ERROR};
use clap::ValueEnum;
#[cfg(feature = "torture")]
use leasehold_servers::{
    redlock_url, ApiServer, EtcdCluster, GcsServer, MotoServer, Pausable, PostgresServer,
    RedisCluster, RedisServer, SentinelSet,
};
use std::path::Path;
#[cfg(feature = "torture")]
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A kind of store `leasehold torture` runs on, its servers started here (file and memory need
/// none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StoreKind {
    File,
    Memory,
    Redis,
    RedisSentinel,
    RedisCluster,
    Redlock,
    Etcd,
    Postgres,
    K8s,
    Gcs,
    S3,
    Azure,
}

/// What `restart` does to a kind's servers (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Restart {
    /// Nothing: no server is started for the kind (file, memory).
    NoServer,
    /// A server killed and started again empty on its port (Redis; one Redlock node).
    StartedEmpty,
    /// A failover (Sentinel; one shard of a Redis Cluster).
    Failover,
    /// A server killed or shut down, then started again over its data (etcd's leader,
    /// PostgreSQL, the API server).
    StartedOverItsData,
    /// The emulator hung (SIGSTOP) for 1.5 TTL, then continued.
    Hung,
}

/// A future of a launcher: the store of the servers it started.
#[cfg(feature = "torture")]
type Launching = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Stores, Failure>>>>;

/// Starts a kind's servers; an etcd cluster's members behind [`Peers`] when asked (the run
/// partitions).
#[cfg(feature = "torture")]
type Launcher = fn(bool) -> Launching;

/// A kind's row of the table: the form of its URL, how its servers start, what `restart` does
/// to them and what it promises then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KindRow {
    /// The form of the store URL its servers give (ports aside): what `partition` proxies.
    pub(crate) url_form: &'static str,
    /// What `restart` does.
    pub(crate) restart: Restart,
    /// What the store promises under `restart`.
    restarted: Promise,
    /// What the server started here is, where the kind does not say it.
    pub(crate) note: Option<&'static str>,
    /// Starts its servers; `None` for a kind this build has no launcher of.
    #[cfg(feature = "torture")]
    launch: Option<Launcher>,
}

/// Both promises kept.
const KEPT: Promise = Promise {
    exclusion: true,
    fences: true,
};

/// Neither promise: grants and fence counters lost.
const LOST: Promise = Promise {
    exclusion: false,
    fences: false,
};

/// `row` with its launcher `f`, in a build with the launchers (`row` alone in one without).
macro_rules! launched_by {
    ($row:expr, $f:ident) => {{
        #[cfg(feature = "torture")]
        let row = KindRow {
            launch: Some($f as Launcher),
            ..$row
        };
        #[cfg(not(feature = "torture"))]
        let row = $row;
        row
    }};
}

impl StoreKind {
    /// Its name on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            StoreKind::File => "file",
            StoreKind::Memory => "memory",
            StoreKind::Redis => "redis",
            StoreKind::RedisSentinel => "redis-sentinel",
            StoreKind::RedisCluster => "redis-cluster",
            StoreKind::Redlock => "redlock",
            StoreKind::Etcd => "etcd",
            StoreKind::Postgres => "postgres",
            StoreKind::K8s => "k8s",
            StoreKind::Gcs => "gcs",
            StoreKind::S3 => "s3",
            StoreKind::Azure => "azure",
        }
    }

    /// The kind named `name`, if it is one.
    pub(crate) fn parse(name: &str) -> Option<StoreKind> {
        <StoreKind as ValueEnum>::from_str(name, false).ok()
    }

    /// Every kind's name, comma-separated.
    pub(crate) fn names() -> String {
        let names: Vec<&str> = StoreKind::value_variants()
            .iter()
            .map(|k| k.name())
            .collect();
        names.join(", ")
    }

    /// Its row of the table (the module documentation says what each restart does).
    pub(crate) fn row(self) -> KindRow {
        let row = |url_form, restart, restarted| KindRow {
            url_form,
            restart,
            restarted,
            note: None,
            #[cfg(feature = "torture")]
            launch: None,
        };
        match self {
            StoreKind::File => row("file:///", Restart::NoServer, KEPT),
            StoreKind::Memory => row("memory://", Restart::NoServer, KEPT),
            StoreKind::Redis => launched_by!(
                row("redis://127.0.0.1:1", Restart::StartedEmpty, LOST),
                launch_redis
            ),
            StoreKind::RedisSentinel => launched_by!(
                row("redis+sentinel://127.0.0.1:1/m", Restart::Failover, LOST),
                launch_sentinel
            ),
            StoreKind::RedisCluster => launched_by!(
                row("redis+cluster://127.0.0.1:1", Restart::Failover, KEPT),
                launch_cluster
            ),
            StoreKind::Redlock => launched_by!(
                row("redlock://127.0.0.1:1", Restart::StartedEmpty, KEPT),
                launch_redlock
            ),
            StoreKind::Etcd => launched_by!(
                row("etcd://127.0.0.1:1", Restart::StartedOverItsData, KEPT),
                launch_etcd
            ),
            StoreKind::Postgres => launched_by!(
                row(
                    "postgres://127.0.0.1:1/db",
                    Restart::StartedOverItsData,
                    KEPT,
                ),
                launch_postgres
            ),
            StoreKind::K8s => launched_by!(
                row(
                    "k8s://torture?server=http://127.0.0.1:1",
                    Restart::StartedOverItsData,
                    KEPT,
                ),
                launch_k8s
            ),
            StoreKind::Gcs => launched_by!(
                row(
                    "gs://torture/torture/?endpoint=http://127.0.0.1:1",
                    Restart::Hung,
                    KEPT,
                ),
                launch_gcs
            ),
            StoreKind::S3 => KindRow {
                note: Some(S3_NOTE),
                ..launched_by!(
                    row(
                        "s3://torture/torture/?endpoint=http://127.0.0.1:1",
                        Restart::Hung,
                        KEPT,
                    ),
                    launch_s3
                )
            },
            StoreKind::Azure => azure_row(row(
                "az://torture/torture/?endpoint=http://127.0.0.1:1",
                Restart::Hung,
                KEPT,
            )),
        }
    }

    /// Whether this build can start its servers (file and memory need none).
    pub(crate) fn launchable(self) -> bool {
        #[cfg(feature = "torture")]
        return self.row().restart == Restart::NoServer || self.row().launch.is_some();
        #[cfg(not(feature = "torture"))]
        return self.row().restart == Restart::NoServer;
    }

    /// What it promises under `fault` (from its page of the documentation): every store keeps
    /// both under `none`, `kill`, `stop`, `partition`, `lost-answer` and `clock`; under `restart`,
    /// its row says (a Redis server restarted empty and an asynchronous Sentinel failover lose
    /// grants and fence counters, so neither is promised).
    pub(crate) fn promises(self, fault: Fault) -> Promise {
        if fault == Fault::Restart {
            self.row().restarted
        } else {
            KEPT
        }
    }
}

/// Azure's row: its launcher only in a build with the Azure store.
fn azure_row(row: KindRow) -> KindRow {
    #[cfg(all(feature = "torture", feature = "azure"))]
    return KindRow {
        launch: Some(launch_azure),
        ..row
    };
    #[cfg(not(all(feature = "torture", feature = "azure")))]
    return row;
}

/// What `s3` runs, which the kind does not say.
const S3_NOTE: &str = "s3: moto behind the harness's serialising proxy (one request in flight to moto at a time: moto alone can accept two concurrent writes on one ETag)";

/// Where a run's store comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// Servers started here for a kind (none for file and memory).
    Started(StoreKind),
    /// `--store URL`: a server the user runs.
    Given(String),
}

impl Source {
    /// What the store promises under `fault`: a kind's row says; a store given by URL is never
    /// restarted here, and keeps both under every other fault.
    pub(crate) fn promises(&self, fault: Fault) -> Promise {
        match self {
            Source::Started(k) => k.promises(fault),
            Source::Given(_) => KEPT,
        }
    }

    /// What the server started here is, where the kind does not say it.
    pub(crate) fn note(&self) -> Option<&'static str> {
        match self {
            Source::Started(k) => k.row().note,
            Source::Given(_) => None,
        }
    }

    /// Whether `restart` can be injected: servers are started here.
    pub(crate) fn restartable(&self) -> bool {
        matches!(self, Source::Started(k) if k.row().restart != Restart::NoServer)
    }
}

/// What a store promises under a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Promise {
    /// No two holders inside one key's section while the earlier one's lease is valid.
    pub(crate) exclusion: bool,
    /// Every grant's fence above the key's highest.
    pub(crate) fences: bool,
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
    /// Its members driven from a blocking thread (each start and restart waits for the member's
    /// peers, whose traffic may go through `peers`).
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
    /// The store at `url`, its clients needing no environment of their own.
    fn plain(url: String, running: Running) -> Stores {
        Stores {
            url,
            env: vec![],
            running,
        }
    }

    /// The store of `source`: a given URL, the file store in `dir`, the memory store, or the
    /// servers of a kind started by its launcher; an etcd cluster's members behind [`Peers`]
    /// when `partition` (the run will partition them).
    ///
    /// # Errors
    /// An error naming the server and what to install (or to pass `--store URL`) when one
    /// cannot start, or when this build has no launcher of the kind (refused before a run).
    pub(crate) async fn start(
        source: &Source,
        dir: &Path,
        partition: bool,
    ) -> Result<Stores, Failure> {
        let kind = match source {
            Source::Given(u) => return Ok(Stores::plain(u.clone(), Running::Nothing)),
            Source::Started(StoreKind::File) => {
                let url = format!("file://{}", dir.join("locks").display());
                return Ok(Stores::plain(url, Running::Nothing));
            }
            Source::Started(StoreKind::Memory) => {
                return Ok(Stores::plain("memory://".to_owned(), Running::Nothing))
            }
            Source::Started(k) => *k,
        };
        #[cfg(feature = "torture")]
        if let Some(launch) = kind.row().launch {
            return launch(partition).await;
        }
        let _ = partition;
        Err(Failure::new(
            ERROR,
            format!(
                "this leasehold cannot start the servers of torture {}",
                kind.name()
            ),
        ))
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

/// A launcher's result, as a launcher's future.
#[cfg(feature = "torture")]
fn ready(stores: Result<Stores, Failure>) -> Launching {
    Box::pin(std::future::ready(stores))
}

#[cfg(feature = "torture")]
fn launch_redis(_: bool) -> Launching {
    ready(
        started("redis-server", RedisServer::start())
            .map(|s| Stores::plain(s.url(), Running::Redis(s))),
    )
}

#[cfg(feature = "torture")]
fn launch_sentinel(_: bool) -> Launching {
    ready(
        started("a Redis Sentinel deployment", SentinelSet::start())
            .map(|s| Stores::plain(s.url(), Running::Sentinel(s))),
    )
}

#[cfg(feature = "torture")]
fn launch_cluster(_: bool) -> Launching {
    ready(
        started("a Redis Cluster", RedisCluster::start())
            .map(|s| Stores::plain(s.url(), Running::Cluster(s))),
    )
}

#[cfg(feature = "torture")]
fn launch_redlock(_: bool) -> Launching {
    let nodes = (0..3)
        .map(|_| RedisServer::start())
        .collect::<Result<Vec<_>, _>>();
    ready(
        started("redis-server (Redlock nodes)", nodes)
            .map(|nodes| Stores::plain(redlock_url(&nodes), Running::Redlock(nodes))),
    )
}

/// Three etcd members, behind [`Peers`] when `partition`.
#[cfg(feature = "torture")]
fn launch_etcd(partition: bool) -> Launching {
    Box::pin(async move {
        let peers = if partition {
            Some(Peers::new(3).map_err(|e| Failure::new(ERROR, e))?)
        } else {
            None
        };
        let behind = peers
            .as_ref()
            .map(|p| (p.ports.clone(), p.pids.clone(), p.aimer()));
        // Off this thread: starting the members blocks until they are healthy.
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
        let url = s.url();
        let cluster = Arc::new(Mutex::new(s));
        Ok(Stores::plain(url, Running::Etcd { cluster, peers }))
    })
}

#[cfg(feature = "torture")]
fn launch_postgres(_: bool) -> Launching {
    let server = PostgresServer::start().and_then(|s| {
        let url = s.fresh_db()?;
        Ok((s, url))
    });
    ready(started("PostgreSQL", server).map(|(s, url)| Stores::plain(url, Running::Postgres(s))))
}

#[cfg(feature = "torture")]
fn launch_k8s(_: bool) -> Launching {
    ready(
        started("leasehold-apiserver over etcd", ApiServer::start())
            .map(|s| Stores::plain(s.store_url("torture"), Running::K8s(s))),
    )
}

#[cfg(feature = "torture")]
fn launch_gcs(_: bool) -> Launching {
    ready(
        started("fake-gcs-server", GcsServer::start())
            .map(|s| Stores::plain(s.store_url("torture/"), Running::Gcs(s))),
    )
}

/// The environment pairs of a launcher, owned.
#[cfg(feature = "torture")]
fn owned_env(pairs: Vec<(&str, String)>) -> Vec<(String, String)> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

#[cfg(feature = "torture")]
fn launch_s3(_: bool) -> Launching {
    let server = MotoServer::start_serialised().and_then(|s| {
        let url = s.url("torture", "torture/")?;
        Ok((s, url))
    });
    ready(started("moto (S3)", server).map(|(s, url)| Stores {
        url,
        env: owned_env(s.env()),
        running: Running::S3(s),
    }))
}

/// Azurite, its container made, its endpoint in the URL (`?endpoint=`).
#[cfg(all(feature = "torture", feature = "azure"))]
fn launch_azure(_: bool) -> Launching {
    use leasehold::stores::azure::{AzureCredentials, AzureOptions, AzureStore, DEV_ACCOUNT};
    Box::pin(async {
        let s = started("Azurite", leasehold_servers::AzuriteServer::start())?;
        let store = AzureStore::connect({
            let mut o = AzureOptions::new("torture");
            o.prefix = "torture/".into();
            o.endpoint = Some(s.endpoint());
            o.credentials = Some(AzureCredentials::new(DEV_ACCOUNT.0, DEV_ACCOUNT.1));
            o
        })?;
        store
            .create_container()
            .await
            .map_err(|e| Failure::new(ERROR, format!("Azurite: {e}")))?;
        Ok(Stores {
            url: format!("az://torture/torture/?endpoint={}", s.endpoint()),
            env: owned_env(s.env()),
            running: Running::Azure(s),
        })
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
            Running::Redis(s) => start_empty(s, "redis-server", down).await?,
            Running::Redlock(nodes) => {
                start_empty(&mut nodes[0], "redis-server (Redlock node)", down).await?;
            }
            Running::Sentinel(set) => {
                let before = set.primary_port();
                set.fail_over(rng.usize(..set.sentinels.len()));
                settle("the Sentinel failover", || {
                    let now = set.primary_port();
                    now.is_some() && now != before
                })
                .await?;
            }
            Running::Cluster(cluster) => fail_over_a_shard(cluster, rng).await?,
            Running::Etcd { cluster, .. } => restart_the_leader(cluster, rng, down).await?,
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
            Running::Gcs(s) => hang(|| s.pause(), || s.resume(), ttl).await,
            Running::S3(s) => hang(|| s.pause(), || s.resume(), ttl).await,
            #[cfg(feature = "azure")]
            Running::Azure(s) => hang(|| s.pause(), || s.resume(), ttl).await,
        }
        Ok(())
    }
}

/// Kills a Redis server, and starts it again empty on its port after `down`.
#[cfg(feature = "torture")]
async fn start_empty(s: &mut RedisServer, what: &str, down: Duration) -> Result<(), Failure> {
    s.stop();
    tokio::time::sleep(down).await;
    started(what, s.start_again())
}

/// A manual failover of a shard of `cluster` picked by `rng`, asked up to three times: one the
/// primary does not join in time is aborted by Redis (seen about once in a hundred under load).
#[cfg(feature = "torture")]
async fn fail_over_a_shard(cluster: &RedisCluster, rng: &mut fastrand::Rng) -> Result<(), Failure> {
    let primaries = cluster.primaries();
    if primaries.is_empty() {
        return Err(Failure::new(ERROR, "the Redis Cluster has no primary"));
    }
    let primary = primaries[rng.usize(..primaries.len())];
    let Some(replica) = cluster.replicas_of(primary).first().map(|r| r.port) else {
        return Err(Failure::new(
            ERROR,
            format!("the Redis Cluster primary on port {primary} has no replica"),
        ));
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        cluster.fail_over_to(replica);
        let done = settle("the Redis Cluster failover", || {
            cluster.is_primary(replica) && cluster.settled()
        })
        .await;
        match done {
            Ok(()) => return Ok(()),
            Err(e) if attempts >= 3 => return Err(e),
            Err(_) => {}
        }
    }
}

/// Kills etcd's Raft leader (a live member picked by `rng` when there is none), and starts it
/// again over its data after `down`.
#[cfg(feature = "torture")]
async fn restart_the_leader(
    cluster: &Arc<Mutex<EtcdCluster>>,
    rng: &mut fastrand::Rng,
    down: Duration,
) -> Result<(), Failure> {
    let (leader, live) = on_etcd(cluster, |c| (c.leader(), c.live().collect::<Vec<_>>())).await?;
    let i = match leader {
        Some(i) => i,
        None if live.is_empty() => return Err(Failure::new(ERROR, "etcd has no member running")),
        None => live[rng.usize(..live.len())],
    };
    on_etcd(cluster, move |c| c.kill(i)).await?;
    tokio::time::sleep(down).await;
    on_etcd(cluster, move |c| c.restart(i))
        .await?
        .map_err(|e| Failure::new(ERROR, format!("etcd did not restart: {e}")))
}

/// Runs `f` on the etcd cluster from a blocking thread, leaving this one to the run's other tasks
/// meanwhile.
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

/// Hangs a server (`pause`) for 1.5 `ttl`, then continues it (`resume`).
#[cfg(feature = "torture")]
async fn hang(pause: impl Fn(), resume: impl Fn(), ttl: Duration) {
    pause();
    tokio::time::sleep(ttl * 3 / 2).await;
    resume();
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
        for kind in StoreKind::value_variants() {
            for fault in [
                Fault::None,
                Fault::Kill,
                Fault::Stop,
                Fault::Partition,
                Fault::LostAnswer,
                Fault::Clock,
            ] {
                assert_eq!(kind.promises(fault), KEPT);
            }
            assert_eq!(StoreKind::parse(kind.name()), Some(*kind));
        }
        assert!(!StoreKind::Redis.promises(Fault::Restart).exclusion);
        assert!(!StoreKind::RedisSentinel.promises(Fault::Restart).fences);
        assert!(StoreKind::Etcd.promises(Fault::Restart).fences);
        assert_eq!(
            Source::Given("redis://x".into()).promises(Fault::Restart),
            KEPT
        );
        assert_eq!(
            StoreKind::names(),
            "file, memory, redis, redis-sentinel, redis-cluster, redlock, etcd, postgres, k8s, gcs, s3, azure"
        );
    }
}
