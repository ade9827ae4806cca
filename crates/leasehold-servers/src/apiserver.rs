//! `leasehold-apiserver`, the Kubernetes-API-compatible Lease server of this workspace, over its
//! own etcd.
//!
//! The program is found, in order: `LEASEHOLD_APISERVER` (a path to it), next to the running
//! executable, on `PATH`. Install it with `cargo install leasehold-apiserver` (or, from a
//! checkout of leasehold, `cargo install --path crates/leasehold-apiserver`).

use crate::error::{Error, Result};
use crate::etcd::EtcdServer;
use crate::http::{http_get, http_ok, http_request};
use crate::process::{free_port, in_three_starts, kill, server_dir, spawn, wait_up, Pausable};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The API server's program name.
const PROGRAM: &str = "leasehold-apiserver";

/// How to install the API server.
const INSTALL_HINT: &str = "install it with `cargo install leasehold-apiserver` (from a checkout of leasehold: `cargo install --path crates/leasehold-apiserver`), or set LEASEHOLD_APISERVER to a leasehold-apiserver program";

/// The `leasehold-apiserver` program: `LEASEHOLD_APISERVER` when set, else the one next to the
/// running executable, else the first on `PATH`.
///
/// # Errors
/// An [`Error::Missing`] saying how to install it when there is none.
pub fn apiserver_bin() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("LEASEHOLD_APISERVER").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            return Err(Error::Missing(format!(
                "LEASEHOLD_APISERVER names {}, which is no file: {INSTALL_HINT}",
                bin.display()
            )));
        }
        return Ok(bin);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(PROGRAM)))
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|dir| dir.join(PROGRAM))
            .find(|p| p.is_file())
    };
    beside
        .or_else(on_path)
        .ok_or_else(|| Error::Missing(format!("{PROGRAM} is not installed: {INSTALL_HINT}")))
}

/// `leasehold-apiserver` (the Kubernetes-API-compatible Lease server) on a free port over its own
/// [`EtcdServer`]; both stopped (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct ApiServer {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
    /// Its program.
    bin: PathBuf,
    etcd: EtcdServer,
    /// Its extra arguments (to start it again alike).
    args: Vec<String>,
    dir: tempfile::TempDir,
}

/// Starts `leasehold-apiserver` (`bin`) on `port` over `etcd` and waits until `/healthz` answers;
/// an error when it cannot be run, exits or does not answer within 20 s.
fn apiserver_launch(bin: &Path, port: u16, etcd: &EtcdServer, args: &[String]) -> Result<Child> {
    let mut cmd = Command::new(bin);
    cmd.args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd", &etcd.url()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut child = spawn(cmd).map_err(|e| {
        Error::Missing(format!(
            "cannot start {} ({e}): {INSTALL_HINT}",
            bin.display()
        ))
    })?;
    wait_up(
        &mut child,
        &format!("leasehold-apiserver on port {port}"),
        Duration::from_secs(20),
        Duration::from_millis(10),
        || http_ok(port, "/healthz", "ok"),
    )
    .map(|()| child)
    .map_err(Error::NotStarted)
}

impl ApiServer {
    /// Starts etcd and the API server ([`apiserver_bin`]) and waits until `/healthz` answers.
    ///
    /// # Errors
    /// When etcd or the API server is missing, or does not come up within 20 s.
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// Starts one with extra arguments (`["--deny", "update"]` to refuse a verb as RBAC would).
    /// An API server that exits before it answers (another process took its port between
    /// [`free_port`] and its bind) is started again on a new port, three times in all.
    ///
    /// # Errors
    /// As [`ApiServer::start`].
    pub fn start_with(args: &[&str]) -> Result<Self> {
        Self::start_program(&apiserver_bin()?, args)
    }

    /// [`ApiServer::start_with`] with the API server program `bin`.
    ///
    /// # Errors
    /// As [`ApiServer::start`].
    pub fn start_program(bin: &Path, args: &[&str]) -> Result<Self> {
        let etcd = EtcdServer::start()?;
        let dir = server_dir("apiserver")?;
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let (port, child) = in_three_starts("leasehold-apiserver", || {
            let port = free_port()?;
            apiserver_launch(bin, port, &etcd, &args).map(|child| (port, child))
        })?;
        Ok(ApiServer {
            port,
            child: Some(child),
            bin: bin.to_owned(),
            etcd,
            args,
            dir,
        })
    }

    /// Starts a stopped API server again, on its port, over its etcd (which kept every Lease).
    ///
    /// # Errors
    /// When it does not answer within 20 s (another process took its port, say).
    pub fn start_again(&mut self) -> Result<()> {
        if self.child.is_none() {
            let child = apiserver_launch(&self.bin, self.port, &self.etcd, &self.args)?;
            self.child = Some(child);
        }
        Ok(())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The etcd behind it.
    pub fn etcd(&self) -> &EtcdServer {
        &self.etcd
    }

    /// A store URL for namespace `ns` on this server: `k8s://NS?server=http://127.0.0.1:PORT`.
    pub fn store_url(&self, ns: &str) -> String {
        format!("k8s://{ns}?server={}", self.url())
    }

    /// Writes a kubeconfig pointing at this server (namespace `ns`) and returns its path.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn kubeconfig(&self, ns: &str) -> Result<PathBuf> {
        let path = self.dir.path().join(format!("kubeconfig-{ns}"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: {ns}\ncurrent-context: test\nusers:\n- name: test\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(&path, text).map_err(Error::io("write a kubeconfig"))?;
        Ok(path)
    }

    /// Lease API requests served since start or the last reset, from `/debug/requests`.
    ///
    /// # Errors
    /// When the server does not answer, or not with JSON.
    pub fn requests(&self) -> Result<serde_json::Value> {
        let (_, body) = http_get(self.port, "/debug/requests").ok_or_else(|| {
            Error::Setup(format!(
                "leasehold-apiserver on port {} does not answer",
                self.port
            ))
        })?;
        serde_json::from_str(&body)
            .map_err(|e| Error::Setup(format!("/debug/requests: {e}: {body}")))
    }

    /// Resets the request counters.
    pub fn reset_requests(&self) {
        let _ = http_request(self.port, "DELETE", "/debug/requests", &[], "");
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the API server (SIGKILL) and waits for it; etcd stops on drop.
    pub fn stop(&mut self) {
        kill(&mut self.child);
    }
}

/// Paused, the API server hangs with its connections open and silent (its etcd runs on).
impl Pausable for ApiServer {
    fn process(&self) -> Option<u32> {
        self.pid()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A missing program is an error saying how to install it, not a panic.
    #[test]
    fn a_missing_apiserver_says_how_to_install_it() {
        // The test binary's directory (target/*/deps) has none; nothing to check where one is
        // installed or named.
        if std::env::var_os("LEASEHOLD_APISERVER").is_some() || apiserver_bin().is_ok() {
            return;
        }
        let e = ApiServer::start().expect_err("no leasehold-apiserver");
        assert!(matches!(e, Error::Missing(_)), "{e}");
        assert!(e.to_string().contains("cargo install"), "{e}");
    }
}
