//! etcd: a single member, plain or over TLS with client certificates, and `etcdctl`.

use crate::certs::test_certs;
use crate::error::{Error, Result};
use crate::http::http_ok;
use crate::process::{
    free_port, in_three_starts, kill, server_dir, spawn, wait_up, with_log_tail, Pausable,
};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// What to do when `etcd` cannot be started.
pub(crate) const ETCD_HINT: &str =
    "install it with `apt-get install etcd-server etcd-client`, or run ./scripts/test which does";

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
    /// # Errors
    /// When `etcd` is missing, or none of the three starts comes up; the message has each
    /// start's failure and the end of its log.
    pub fn start() -> Result<Self> {
        in_three_starts("etcd", Self::start_once)
    }

    fn start_once() -> Result<Self> {
        let dir = server_dir("etcd")?;
        let (port, peer) = (free_port()?, free_port()?);
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log_path = dir.path().join("log");
        let log = std::fs::File::create(&log_path).map_err(Error::io("create etcd's log"))?;
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
        let mut child = spawn(cmd)
            .map_err(|e| Error::Missing(format!("cannot start etcd ({e}): {ETCD_HINT}")))?;
        let up = wait_up(
            &mut child,
            &format!("etcd on ports {port}/{peer}"),
            Duration::from_secs(20),
            Duration::from_millis(20),
            || http_ok(port, "/health", "\"health\":\"true\""),
        );
        if let Err(why) = up {
            return Err(Error::NotStarted(with_log_tail(&why, &log_path)));
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
        kill(&mut self.child);
    }
}

impl Pausable for EtcdServer {
    fn process(&self) -> Option<u32> {
        self.pid()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
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
    /// # Errors
    /// When `etcd`, `etcdctl` or `openssl` is missing, or it does not come up.
    pub fn start() -> Result<Self> {
        in_three_starts("etcd over TLS", Self::start_once)
    }

    fn start_once() -> Result<Self> {
        let certs = test_certs()?;
        let dir = server_dir("etcd-tls")?;
        let (port, peer) = (free_port()?, free_port()?);
        let client_url = format!("https://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let c = |f: &str| certs.path().join(f);
        let log = std::fs::File::create(dir.path().join("log"))
            .map_err(Error::io("create etcd's log"))?;
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
        let mut child = spawn(cmd)
            .map_err(|e| Error::Missing(format!("cannot start etcd ({e}): {ETCD_HINT}")))?;
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
        up.map_err(Error::NotStarted)?;
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
        kill(&mut self.child);
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
