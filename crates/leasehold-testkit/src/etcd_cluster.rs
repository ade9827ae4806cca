//! etcd for tests: a shared single member (the [`EtcdServer`] of [`crate::servers`]) and a
//! cluster of several members ([`EtcdCluster`], the launcher's
//! [`leasehold_servers::EtcdCluster`]) on free loopback ports, in temp dirs, members stopped by
//! PID (SIGKILL) on drop and killed with the test process (`PR_SET_PDEATHSIG`).

use crate::servers::{ok, wrapper, EtcdServer};
use leasehold_servers as launch;
use std::sync::OnceLock;

pub use leasehold_servers::{etcdctl, MemberPids};

/// One etcd member shared by all tests of this process (each test uses its own key prefix).
pub fn shared_etcd() -> &'static EtcdServer {
    static SERVER: OnceLock<EtcdServer> = OnceLock::new();
    SERVER.get_or_init(EtcdServer::start)
}

/// The store URL of a single member: `etcd://127.0.0.1:PORT`.
pub fn store_url(server: &launch::EtcdServer) -> String {
    format!("etcd://127.0.0.1:{}", server.port)
}

wrapper!(
    /// A cluster of etcd members on loopback ([`launch::EtcdCluster`]).
    EtcdCluster = launch::EtcdCluster
);

impl EtcdCluster {
    /// Starts `n` members and waits until each says it is healthy.
    ///
    /// # Panics
    /// When `etcd` is missing, or no start comes up.
    pub fn start(n: usize) -> Self {
        Self(ok(launch::EtcdCluster::start(n)))
    }

    /// Starts a member per port of `proxies` whose peer traffic goes through the caller's proxies
    /// on those ports ([`launch::EtcdCluster::start_with_peer_proxies`]).
    ///
    /// # Panics
    /// When `etcd` is missing, when `pids` is not for as many members, or no start comes up.
    pub fn start_with_peer_proxies(
        proxies: &[u16],
        pids: &MemberPids,
        aim: impl FnMut(&[u16]),
    ) -> Self {
        Self(ok(launch::EtcdCluster::start_with_peer_proxies(
            proxies, pids, aim,
        )))
    }
}

/// One 3-member cluster shared by the tests of this process that leave it whole.
pub fn shared_etcd_cluster() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

wrapper!(
    /// A single etcd member that speaks only TLS and asks clients for a certificate
    /// ([`launch::EtcdTlsServer`]).
    EtcdTlsServer = launch::EtcdTlsServer
);

impl EtcdTlsServer {
    /// Starts it and waits until `etcdctl endpoint health` over TLS succeeds.
    ///
    /// # Panics
    /// When `etcd`, `etcdctl` or `openssl` is missing, or it does not come up.
    pub fn start() -> Self {
        Self(ok(launch::EtcdTlsServer::start()))
    }
}
