//! An S3 server for tests: `moto` in server mode (PyPI `moto[server]`) on a free 127.0.0.1 port,
//! from the Python venv `./scripts/test` makes (`target/pyenv-moto`), stopped by PID.
//!
//! moto answers 412 to a failed `If-None-Match: *` or `If-Match` on signed requests (PUT and
//! DELETE), and takes any access key: the tests use `test` / `test`.

use crate::servers::{
    free_port, http_get, http_request, in_three_starts, server_dir, spawn, wait_up,
};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The access key the tests sign with (moto takes any).
pub const ACCESS_KEY: (&str, &str) = ("test", "test");

/// The Python that has moto: `LEASEHOLD_MOTO_PYTHON`, else `target/pyenv-moto/bin/python` of
/// the workspace (`./scripts/test` makes it), else `LEASEHOLD_PYTHON`.
pub fn moto_python() -> PathBuf {
    if let Some(p) = std::env::var_os("LEASEHOLD_MOTO_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/pyenv-moto/bin/python"
    ));
    if venv.exists() {
        return venv;
    }
    std::env::var_os("LEASEHOLD_PYTHON")
        .map(PathBuf::from)
        .unwrap_or(venv)
}

const INSTALL_HINT: &str = "run ./scripts/test (it makes target/pyenv-moto with `moto[server]`), or set LEASEHOLD_MOTO_PYTHON to a Python that has `moto[server]`";

/// A moto S3 server on a free port, killed (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct MotoServer {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

/// A signature moto accepts (it checks none); real S3 would refuse it.
const UNCHECKED_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";

impl MotoServer {
    /// Starts moto and waits until it answers.
    ///
    /// # Panics
    /// When moto is missing or does not come up in three starts.
    pub fn start() -> Self {
        in_three_starts("moto", Self::start_once)
    }

    fn start_once() -> Result<Self, String> {
        let dir = server_dir("moto");
        let port = free_port();
        let python = moto_python();
        let log = std::fs::File::create(dir.path().join("log")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&python);
        cmd.args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(log);
        let mut child = spawn(cmd).unwrap_or_else(|e| {
            panic!(
                "cannot start moto with {} ({e}): {INSTALL_HINT}",
                python.display()
            )
        });
        let up = wait_up(
            &mut child,
            &format!("moto on port {port}"),
            Duration::from_secs(30),
            Duration::from_millis(25),
            || http_get(port, "/moto-api/").is_some(),
        );
        if let Err(why) = up {
            let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
            if log.contains("No module named") {
                panic!(
                    "moto is not installed for {}: {INSTALL_HINT}\n{log}",
                    python.display()
                );
            }
            return Err(format!("{why}; its log:\n{log}"));
        }
        Ok(MotoServer {
            port,
            child: Some(child),
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates `bucket` (nothing happens if it exists).
    ///
    /// # Panics
    /// When moto does not answer 200.
    pub fn create_bucket(&self, bucket: &str) {
        let answer = http_request(
            self.port,
            "PUT",
            &format!("/{bucket}"),
            &[("Authorization", UNCHECKED_AUTH)],
            "",
        );
        assert!(
            matches!(answer, Some((200, _))),
            "create bucket {bucket}: {answer:?}"
        );
    }

    /// The URL of the store on `bucket` (created) under `prefix`.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        self.create_bucket(bucket);
        format!("s3://{bucket}/{prefix}?endpoint={}", self.endpoint())
    }

    /// The environment a process opening [`url`](Self::url) needs: the access key and region.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.0.into()),
            ("AWS_SECRET_ACCESS_KEY", ACCESS_KEY.1.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// The store on `bucket` (created) under `prefix`, opened in this process with the test
    /// access key.
    pub fn store(&self, bucket: &str, prefix: &str) -> leasehold::stores::s3::S3Store {
        self.create_bucket(bucket);
        let mut o = leasehold::stores::s3::S3Options::new(bucket);
        o.prefix = prefix.into();
        o.endpoint = Some(self.endpoint());
        o.region = Some("us-east-1".into());
        o.credentials = Some(leasehold::stores::s3::AwsCredentials::new(
            ACCESS_KEY.0,
            ACCESS_KEY.1,
            None,
        ));
        leasehold::stores::s3::S3Store::connect(o).expect("S3 store")
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One moto server shared by the tests of a process.
pub fn shared_moto() -> &'static MotoServer {
    static S: OnceLock<MotoServer> = OnceLock::new();
    S.get_or_init(MotoServer::start)
}
