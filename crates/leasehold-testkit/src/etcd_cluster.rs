//! etcd for tests: a shared single member (the [`EtcdServer`] of [`crate::servers`]) and a
//! cluster of several members ([`EtcdCluster`]) on free loopback ports, in temp dirs, members
//! stopped by PID (SIGKILL) on drop and killed with the test process (`PR_SET_PDEATHSIG`).
//!
//! A cluster's peer traffic can go through proxies of the caller
//! ([`EtcdCluster::start_with_peer_proxies`]): each member listens for its peers on a port of its
//! own and advertises its proxy's port instead, so that a member can be partitioned from its
//! peers. The kit only chooses the ports and advertises them; the caller forwards.

use crate::servers::{free_port, http_ok, in_three_starts, server_dir, spawn, wait_up, EtcdServer};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// One etcd member shared by all tests of this process (each test uses its own key prefix).
pub fn shared_etcd() -> &'static EtcdServer {
    static SERVER: OnceLock<EtcdServer> = OnceLock::new();
    SERVER.get_or_init(EtcdServer::start)
}

/// The store URL of a single member: `etcd://127.0.0.1:PORT`.
pub fn store_url(server: &EtcdServer) -> String {
    format!("etcd://127.0.0.1:{}", server.port)
}

/// A cluster of etcd members on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    /// The members' client ports.
    pub ports: Vec<u16>,
    /// The members' peer ports, where each listens.
    peers: Vec<u16>,
    /// The peer ports the members advertise (in `--initial-cluster` too): `peers`, or the ports
    /// of the caller's proxies.
    advertised: Vec<u16>,
    children: Vec<Option<Child>>,
    pids: MemberPids,
    _dir: tempfile::TempDir,
}

/// The PIDs of a cluster's running members, by member, shared with the caller: kept up to date
/// as members are killed and started again, so that a clone taken before the start follows them.
#[derive(Debug, Clone)]
pub struct MemberPids(Arc<[AtomicU32]>);

impl MemberPids {
    /// A table for `n` members, none running yet.
    pub fn new(n: usize) -> Self {
        MemberPids((0..n).map(|_| AtomicU32::new(0)).collect())
    }

    /// The PID of member `i`, while it runs.
    pub fn get(&self, i: usize) -> Option<u32> {
        self.0
            .get(i)
            .map(|p| p.load(Ordering::Acquire))
            .filter(|p| *p != 0)
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the cluster has no member.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn set(&self, i: usize, child: Option<&Child>) {
        if let Some(p) = self.0.get(i) {
            p.store(child.map_or(0, Child::id), Ordering::Release);
        }
    }
}

impl EtcdCluster {
    /// Starts `n` members and waits until each says it is healthy (a start that fails is tried
    /// again on new ports, three times in all).
    ///
    /// # Panics
    /// When `etcd` is missing, or no start comes up.
    pub fn start(n: usize) -> Self {
        let pids = MemberPids::new(n);
        in_three_starts("etcd cluster", || {
            Self::start_once(n, None, &mut |_| {}, &pids)
        })
    }

    /// Starts a member per port of `proxies` whose peer traffic goes through the caller's proxies
    /// on those ports: member `i` advertises `http://127.0.0.1:{proxies[i]}` as its peer URL, to
    /// its peers and in `--initial-cluster` (its member ID derives from it), and listens on a
    /// peer port of its own. Before any member starts, `aim` is told each member's own peer port,
    /// by member (each new start attempt calls it again, with new ports): the proxies must
    /// forward there from then on, without waiting for this call to return, or no member becomes
    /// healthy. `pids` (as many as `proxies`) is kept up to date with the members' PIDs as they
    /// start, are [killed](EtcdCluster::kill) and [restarted](EtcdCluster::restart).
    ///
    /// # Panics
    /// When `etcd` is missing, when `pids` is not for as many members, or no start comes up.
    pub fn start_with_peer_proxies(
        proxies: &[u16],
        pids: &MemberPids,
        mut aim: impl FnMut(&[u16]),
    ) -> Self {
        assert_eq!(pids.len(), proxies.len(), "one PID slot per member's proxy");
        in_three_starts("etcd cluster behind peer proxies", || {
            Self::start_once(proxies.len(), Some(proxies), &mut aim, pids)
        })
    }

    fn start_once(
        n: usize,
        proxies: Option<&[u16]>,
        aim: &mut dyn FnMut(&[u16]),
        pids: &MemberPids,
    ) -> Result<Self, String> {
        let dir = server_dir("etcd-cluster");
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let peers: Vec<u16> = (0..n).map(|_| free_port()).collect();
        aim(&peers);
        let advertised = proxies.map_or_else(|| peers.clone(), <[u16]>::to_vec);
        let mut cluster = EtcdCluster {
            ports,
            peers,
            advertised,
            children: (0..n).map(|_| None).collect(),
            pids: pids.clone(),
            _dir: dir,
        };
        for i in 0..n {
            // On an error the cluster's drop stops the members already started.
            cluster.launch(i)?;
        }
        for i in 0..n {
            let port = cluster.ports[i];
            let Some(child) = cluster.children[i].as_mut() else {
                continue;
            };
            let up = wait_up(
                child,
                &format!("etcd member m{i} on port {port}"),
                Duration::from_secs(20),
                Duration::from_millis(20),
                || http_ok(port, "/health", "\"health\":\"true\""),
            );
            if let Err(why) = up {
                let log = cluster._dir.path().join(format!("m{i}.log"));
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(8)..].join("\n");
                return Err(format!("{why}; its log ends:\n{tail}"));
            }
        }
        Ok(cluster)
    }

    /// The members' PIDs, following kills and restarts.
    pub fn pids(&self) -> MemberPids {
        self.pids.clone()
    }

    /// The peer port each member listens on.
    pub fn peer_ports(&self) -> &[u16] {
        &self.peers
    }

    /// The peer port each member advertises: its own, or its proxy's
    /// ([`start_with_peer_proxies`](EtcdCluster::start_with_peer_proxies)).
    pub fn advertised_peer_ports(&self) -> &[u16] {
        &self.advertised
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,…` (every member, dead ones included).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The index of the member that is the Raft leader now, as the live members report it
    /// (`etcdctl endpoint status`).
    pub fn leader(&self) -> Option<usize> {
        let endpoints: Vec<String> = self
            .live()
            .map(|i| format!("http://127.0.0.1:{}", self.ports[i]))
            .collect();
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &endpoints.join(",")])
            .args([
                "--command-timeout",
                "2s",
                "endpoint",
                "status",
                "-w",
                "json",
            ])
            .output()
            .ok()?;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let rows = status.as_array()?;
        let leader = rows
            .iter()
            .find_map(|r| r["Status"]["leader"].as_u64().filter(|l| *l != 0))?;
        let endpoint = rows
            .iter()
            .find(|r| r["Status"]["header"]["member_id"].as_u64() == Some(leader))?["Endpoint"]
            .as_str()?
            .to_owned();
        self.ports
            .iter()
            .position(|p| endpoint.ends_with(&format!(":{p}")))
    }

    /// The members still running.
    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.ports.len()).filter(|i| self.children[*i].is_some())
    }

    /// Starts member `i` again after a [kill](EtcdCluster::kill), on its ports and over its data
    /// (it rejoins the cluster), and waits until it says it is healthy.
    ///
    /// # Errors
    /// When it exits or is not healthy within 20 s.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.children[i].is_some() {
            return Ok(());
        }
        self.launch(i)?;
        let port = self.ports[i];
        let Some(child) = self.children[i].as_mut() else {
            return Ok(());
        };
        let up = wait_up(
            child,
            &format!("etcd member m{i} on port {port}"),
            Duration::from_secs(20),
            Duration::from_millis(20),
            || http_ok(port, "/health", "\"health\":\"true\""),
        );
        if up.is_err() {
            // wait_up killed and reaped it.
            self.children[i] = None;
            self.pids.set(i, None);
        }
        up
    }

    /// Kills member `i` with SIGKILL (no leadership transfer) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            self.pids.set(i, None);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` (its data in `dir/m{i}`, its log `dir/m{i}.log`, appended to) on its
    /// ports, advertising its advertised peer URL, `--initial-cluster` naming every member's,
    /// without waiting for it.
    fn launch(&mut self, i: usize) -> Result<(), String> {
        let initial: Vec<String> = self
            .advertised
            .iter()
            .enumerate()
            .map(|(m, peer)| format!("m{m}=http://127.0.0.1:{peer}"))
            .collect();
        let dir = self._dir.path();
        let client_url = format!("http://127.0.0.1:{}", self.ports[i]);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("m{i}.log")))
            .map_err(|e| format!("etcd log: {e}"))?;
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", &format!("m{i}"), "--data-dir"])
            .arg(dir.join(format!("m{i}")))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args([
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", self.peers[i]),
            ])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", self.advertised[i]),
            ])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-token", "leasehold-test"])
            .args(["--initial-cluster-state", "new", "--unsafe-no-fsync"])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log);
        let child = spawn(cmd).map_err(|e| {
            format!("cannot start etcd ({e}): install it with `apt-get install etcd-server etcd-client`, or run ./scripts/test which does")
        })?;
        self.pids.set(i, Some(&child));
        self.children[i] = Some(child);
        Ok(())
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// One 3-member cluster shared by the tests of this process that leave it whole.
pub fn shared_etcd_cluster() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

/// A single etcd member that speaks only TLS and asks clients for a certificate
/// (`--client-cert-auth`), with its CA and a client certificate in [`EtcdTlsServer::certs`].
#[derive(Debug)]
pub struct EtcdTlsServer {
    /// Its client port (`https://127.0.0.1:PORT`).
    pub port: u16,
    child: Option<Child>,
    certs: tempfile::TempDir,
    _dir: tempfile::TempDir,
}

impl EtcdTlsServer {
    /// Starts it and waits until `etcdctl endpoint health` over TLS succeeds.
    ///
    /// # Panics
    /// When `etcd`, `etcdctl` or `openssl` is missing, or it does not come up.
    pub fn start() -> Self {
        in_three_starts("etcd over TLS", Self::start_once)
    }

    fn start_once() -> Result<Self, String> {
        let certs = crate::servers::test_certs();
        let dir = server_dir("etcd-tls");
        let (port, peer) = (free_port(), free_port());
        let client_url = format!("https://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let c = |f: &str| certs.path().join(f);
        let log =
            std::fs::File::create(dir.path().join("log")).map_err(|e| format!("etcd log: {e}"))?;
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "tls", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("tls={peer_url}")])
            .args(["--initial-cluster-state", "new", "--unsafe-no-fsync"])
            .arg("--cert-file")
            .arg(c("server.crt"))
            .arg("--key-file")
            .arg(c("server.key"))
            .arg("--trusted-ca-file")
            .arg(c("ca.crt"))
            .arg("--client-cert-auth")
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = spawn(cmd).unwrap_or_else(|e| {
            panic!("cannot start etcd ({e}): install it with `apt-get install etcd-server etcd-client`, or run ./scripts/test which does")
        });
        let server = |child| EtcdTlsServer {
            port,
            child,
            certs,
            _dir: dir,
        };
        let probe = server(None);
        let up = wait_up(
            &mut child,
            &format!("etcd over TLS on port {port}"),
            Duration::from_secs(20),
            Duration::from_millis(100),
            || probe.etcdctl(&["endpoint", "health"]).is_some(),
        );
        let mut s = probe;
        up?;
        s.child = Some(child);
        Ok(s)
    }

    /// The directory holding `ca.crt`, `client.crt` and `client.key`.
    pub fn certs(&self) -> &std::path::Path {
        self.certs.path()
    }

    /// `etcd://127.0.0.1:PORT?ca=…&cert=…&key=…`: the store URL with the CA and the client
    /// certificate.
    pub fn url(&self) -> String {
        let c = |f: &str| self.certs.path().join(f).display().to_string();
        format!(
            "etcd://127.0.0.1:{}?ca={}&cert={}&key={}",
            self.port,
            c("ca.crt"),
            c("client.crt"),
            c("client.key")
        )
    }

    /// Runs `etcdctl ARGS` against it with the client certificate: its output when it succeeds.
    pub fn etcdctl(&self, args: &[&str]) -> Option<String> {
        let c = |f: &str| self.certs.path().join(f);
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &format!("https://127.0.0.1:{}", self.port)])
            .arg("--cacert")
            .arg(c("ca.crt"))
            .arg("--cert")
            .arg(c("client.crt"))
            .arg("--key")
            .arg(c("client.key"))
            .args(["--command-timeout", "2s"])
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for EtcdTlsServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `etcdctl ARGS` against the plain member on `port`: its output when it succeeds.
pub fn etcdctl(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &format!("http://127.0.0.1:{port}")])
        .args(["--command-timeout", "2s"])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
