//! A cluster of etcd members on loopback, whose peer traffic can go through the caller's proxies.
//!
//! With [`EtcdCluster::start_with_peer_proxies`], each member listens for its peers on a port of
//! its own and advertises its proxy's port instead, so that a member can be partitioned from its
//! peers. The launcher only chooses the ports and advertises them; the caller forwards.

use crate::error::{Error, Result};
use crate::etcd::ETCD_HINT;
use crate::http::http_ok;
use crate::process::{free_port, in_three_starts, kill, server_dir, spawn, wait_up, with_log_tail};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A cluster of etcd members on loopback, stopped (SIGKILL by PID) on drop.
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
    /// # Errors
    /// When `etcd` is missing, or no start comes up.
    pub fn start(n: usize) -> Result<Self> {
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
    /// # Errors
    /// When `etcd` is missing, when `pids` is not for as many members (an [`Error::Setup`]), or
    /// no start comes up.
    pub fn start_with_peer_proxies(
        proxies: &[u16],
        pids: &MemberPids,
        mut aim: impl FnMut(&[u16]),
    ) -> Result<Self> {
        if pids.len() != proxies.len() {
            return Err(Error::Setup(format!(
                "{} PID slots for {} members' proxies: one per member",
                pids.len(),
                proxies.len()
            )));
        }
        in_three_starts("etcd cluster behind peer proxies", || {
            Self::start_once(proxies.len(), Some(proxies), &mut aim, pids)
        })
    }

    fn start_once(
        n: usize,
        proxies: Option<&[u16]>,
        aim: &mut dyn FnMut(&[u16]),
        pids: &MemberPids,
    ) -> Result<Self> {
        let dir = server_dir("etcd-cluster")?;
        let ports = (0..n).map(|_| free_port()).collect::<Result<Vec<u16>>>()?;
        let peers = (0..n).map(|_| free_port()).collect::<Result<Vec<u16>>>()?;
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
            if let Err(why) = cluster.wait_healthy(i) {
                let log = cluster._dir.path().join(format!("m{i}.log"));
                return Err(Error::NotStarted(with_log_tail(&why, &log)));
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
    pub fn restart(&mut self, i: usize) -> Result<()> {
        if self.children[i].is_some() {
            return Ok(());
        }
        self.launch(i)?;
        let up = self.wait_healthy(i);
        if up.is_err() {
            // wait_up killed and reaped it.
            self.children[i] = None;
            self.pids.set(i, None);
        }
        up.map_err(Error::NotStarted)
    }

    /// Waits until member `i` (when running) says it is healthy, for at most 20 s; on an error
    /// `wait_up` has killed and reaped it.
    fn wait_healthy(&mut self, i: usize) -> std::result::Result<(), String> {
        let port = self.ports[i];
        let Some(child) = self.children[i].as_mut() else {
            return Ok(());
        };
        wait_up(
            child,
            &format!("etcd member m{i} on port {port}"),
            Duration::from_secs(20),
            Duration::from_millis(20),
            || http_ok(port, "/health", "\"health\":\"true\""),
        )
    }

    /// Kills member `i` with SIGKILL (no leadership transfer) and waits for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = self.children.get_mut(i) {
            self.pids.set(i, None);
            kill(child);
        }
    }

    /// Starts member `i` (its data in `dir/m{i}`, its log `dir/m{i}.log`, appended to) on its
    /// ports, advertising its advertised peer URL, `--initial-cluster` naming every member's,
    /// without waiting for it.
    fn launch(&mut self, i: usize) -> Result<()> {
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
            .map_err(Error::io("open an etcd member's log"))?;
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
        let child = spawn(cmd)
            .map_err(|e| Error::Missing(format!("cannot start etcd ({e}): {ETCD_HINT}")))?;
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
