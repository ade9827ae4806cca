//! Launchers for the real servers [leasehold](https://crates.io/crates/leasehold)'s stores run
//! on: `redis-server` (plain, TLS, mutual TLS, ACL users), a Redis Sentinel deployment, a Redis
//! Cluster, etcd (one member, over TLS, or a cluster whose peer traffic can go through the
//! caller's proxies), PostgreSQL (plain or TLS), `leasehold-apiserver` (Kubernetes Leases over
//! etcd), moto (S3), fake-gcs-server (Cloud Storage) and Azurite (Azure Blob). leasehold's test
//! suite and `leasehold torture` start their servers with them, and reach them through its
//! fault-injecting [`TcpProxy`] where the network is to fail; a server that can hang with its
//! connections open is [`Pausable`].
//!
//! Each server runs on free 127.0.0.1 ports with its files in a temp dir under /tmp, is started
//! with `PR_SET_PDEATHSIG` (it dies with this process, even when this process is killed), and is
//! stopped by PID (SIGKILL) when its value is dropped. A launcher waits until its server answers,
//! tries new ports when another process took one first (three starts in all), and returns an
//! [`Error`] rather than panicking: [`Error::Missing`] says what to install (or which variable
//! names the program), [`Error::NotStarted`] carries the server's log. Nothing is mocked: the
//! programs must be installed (`redis-server`, `etcd`, PostgreSQL, …, each launcher's
//! documentation names them).
//!
//! Linux only (`PR_SET_PDEATHSIG`, `/proc`).
//!
//! # Example
//!
//! ```no_run
//! use leasehold_servers::{Error, RedisServer};
//!
//! fn main() -> Result<(), Error> {
//!     let redis = RedisServer::start()?;
//!     println!("a store at {}", redis.url()); // redis://127.0.0.1:PORT/0
//!     assert!(redis.ping());
//!     Ok(())
//!     // Dropped here: the server is killed.
//! }
//! ```

mod apiserver;
mod azurite;
mod certs;
mod cluster;
mod error;
mod etcd;
mod etcd_cluster;
mod gcs;
mod http;
mod moto;
mod postgres;
mod process;
mod proxy;
mod redis;
mod sentinel;
mod tcp_proxy;

pub use apiserver::{apiserver_bin, ApiServer};
pub use azurite::{azurite_bin, AzuriteServer, DEV_ACCOUNT};
pub use certs::{sign_cert, test_certs, CLIENT_EXT};
pub use cluster::RedisCluster;
pub use error::{Error, Result};
pub use etcd::{etcdctl, EtcdServer, EtcdTlsServer};
pub use etcd_cluster::{EtcdCluster, MemberPids};
pub use gcs::{gcs_bin, GcsServer, BUCKET};
pub use http::{http_get, http_request};
pub use moto::{moto_python, MotoServer, ACCESS_KEY};
pub use postgres::{pg_roles, postgres_bin, PostgresServer};
pub use process::{free_port, sweep_faketime_leftovers, Pausable};
pub use proxy::SerialisingProxy;
pub use redis::{command_on, commands_on, redlock_url, redlock_url_of, RedisServer, LOCKER_ACL};
pub use sentinel::{SentinelServer, SentinelSet, SENTINEL_MASTER};
pub use tcp_proxy::{Link, Links, PartiesOf, TcpProxy, TcpProxyOptions};
