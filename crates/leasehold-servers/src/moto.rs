//! An S3 server: `moto` in server mode (PyPI `moto[server]`) on a free 127.0.0.1 port, from the
//! Python `LEASEHOLD_MOTO_PYTHON` names (`./scripts/test` makes `target/pyenv-moto`), stopped by
//! PID.
//!
//! moto answers 412 to a failed `If-None-Match: *` or `If-Match` on signed requests (PUT and
//! DELETE), and takes any access key: [`ACCESS_KEY`] is `test` / `test`. Its conditional writes
//! race: it accepts two PUTs with `If-Match` the same ETag when they arrive together, which S3
//! refuses. [`MotoServer::start_serialised`] puts the serialising proxy
//! ([`crate::SerialisingProxy`]) in front of it, one request in flight to moto at a time, so
//! that each conditional write is checked against the state the previous one left.

use crate::error::{Error, Result};
use crate::http::{http_get, http_request};
use crate::process::{free_port, in_three_starts, kill, server_dir, spawn, wait_up, Pausable};
use crate::proxy::SerialisingProxy;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The access key to sign with (moto takes any).
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

/// A moto S3 server on a free port, perhaps behind the serialising proxy; both killed (SIGKILL by
/// PID) on drop.
#[derive(Debug)]
pub struct MotoServer {
    /// moto's own port.
    pub port: u16,
    child: Option<Child>,
    /// The serialising proxy clients go through, if started with it.
    proxy: Option<SerialisingProxy>,
    _dir: tempfile::TempDir,
}

/// A signature moto accepts (it checks none); real S3 would refuse it.
const UNCHECKED_AUTH: &str = "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";

impl MotoServer {
    /// Starts moto and waits until it answers.
    ///
    /// # Errors
    /// When moto is missing or does not come up in three starts.
    pub fn start() -> Result<Self> {
        in_three_starts("moto", || Self::start_once(None))
    }

    /// Starts moto behind the serialising proxy (see the module documentation).
    ///
    /// # Errors
    /// When moto or the proxy does not start.
    pub fn start_serialised() -> Result<Self> {
        Self::start()?.serialised()
    }

    /// Starts moto patched to wait `delay` between its check of a PUT's `If-Match` or
    /// `If-None-Match` and its write, so that concurrent conditional writes on one object race
    /// nearly every time: a test of what serialises them (not a server to test a store on).
    ///
    /// # Errors
    /// When moto does not start.
    pub fn start_with_racing_writes(delay: Duration) -> Result<Self> {
        in_three_starts("moto", || Self::start_once(Some(delay)))
    }

    /// This server behind a serialising proxy started now: [`endpoint`](Self::endpoint) and
    /// [`url`](Self::url) go through the proxy, [`raw_endpoint`](Self::raw_endpoint) and
    /// [`pid`](Self::pid) are moto's own.
    ///
    /// # Errors
    /// When the proxy does not start.
    pub fn serialised(mut self) -> Result<Self> {
        self.proxy = Some(SerialisingProxy::start(&moto_python(), self.port, false)?);
        Ok(self)
    }

    fn start_once(racing_writes: Option<Duration>) -> Result<Self> {
        let dir = server_dir("moto")?;
        let port = free_port()?;
        let python = moto_python();
        let log = std::fs::File::create(dir.path().join("log"))
            .map_err(Error::io("create moto's log"))?;
        let mut cmd = Command::new(&python);
        match racing_writes {
            None => cmd.args(["-m", "moto.server"]),
            // `_get_checksum` runs between PutObject's precondition check and its write.
            Some(delay) => cmd.args([
                "-c",
                &format!(
                    "import sys, time\n\
                     from moto.s3.responses import S3Response\n\
                     checksum = S3Response._get_checksum\n\
                     def slow(self, headers):\n    time.sleep({})\n    return checksum(self, headers)\n\
                     S3Response._get_checksum = slow\n\
                     from moto.server import main\n\
                     main(sys.argv[1:])",
                    delay.as_secs_f64()
                ),
            ]),
        };
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = spawn(cmd).map_err(|e| {
            Error::Missing(format!(
                "cannot start moto with {} ({e}): {INSTALL_HINT}",
                python.display()
            ))
        })?;
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
                return Err(Error::Missing(format!(
                    "moto is not installed for {}: {INSTALL_HINT}\n{log}",
                    python.display()
                )));
            }
            return Err(Error::NotStarted(format!("{why}; its log:\n{log}")));
        }
        Ok(MotoServer {
            port,
            child: Some(child),
            proxy: None,
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT` of what clients talk to: the serialising proxy if there is one,
    /// else moto.
    pub fn endpoint(&self) -> String {
        let port = self
            .proxy
            .as_ref()
            .map_or(self.port, SerialisingProxy::port);
        format!("http://127.0.0.1:{port}")
    }

    /// `http://127.0.0.1:PORT` of moto itself.
    pub fn raw_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates `bucket` (nothing happens if it exists).
    ///
    /// # Errors
    /// When moto does not answer 200.
    pub fn create_bucket(&self, bucket: &str) -> Result<()> {
        let answer = http_request(
            self.port,
            "PUT",
            &format!("/{bucket}"),
            &[("Authorization", UNCHECKED_AUTH)],
            "",
        );
        match answer {
            Some((200, _)) => Ok(()),
            other => Err(Error::Setup(format!("create bucket {bucket}: {other:?}"))),
        }
    }

    /// The URL of the store on `bucket` (created) under `prefix`; a process opening it needs
    /// [`env`](Self::env).
    ///
    /// # Errors
    /// As [`MotoServer::create_bucket`].
    pub fn url(&self, bucket: &str, prefix: &str) -> Result<String> {
        self.create_bucket(bucket)?;
        Ok(format!(
            "s3://{bucket}/{prefix}?endpoint={}",
            self.endpoint()
        ))
    }

    /// The environment a process opening [`url`](Self::url) needs: the access key and region.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.0.into()),
            ("AWS_SECRET_ACCESS_KEY", ACCESS_KEY.1.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// moto's PID (not the proxy's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Pausable for MotoServer {
    fn process(&self) -> Option<u32> {
        self.pid()
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        // The proxy stops with its own value, after this.
        kill(&mut self.child);
    }
}
