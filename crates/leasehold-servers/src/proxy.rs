//! The serialising HTTP proxy (`py/serialising_proxy.py`, embedded in this crate and written to
//! the proxy's temp dir): it passes requests to an emulator one at a time over one connection, so
//! that the emulator checks each conditional write against the state the previous write left, as
//! the real service does. Cloud Storage ([`crate::GcsServer`]) adds its DELETE precondition
//! check; S3 on moto ([`crate::MotoServer::start_serialised`]) needs only the serialising.

use crate::error::{Error, Result};
use crate::process::{kill, server_dir, spawn};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The proxy's script (standard library only).
const SCRIPT: &str = include_str!("../py/serialising_proxy.py");

/// The proxy process in front of an emulator, killed (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct SerialisingProxy {
    port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl SerialisingProxy {
    /// Starts the proxy with `python` (standard library only) in front of the emulator on
    /// `upstream`; with `gcs_delete_precondition`, it also enforces `ifGenerationMatch` on a
    /// DELETE of a Cloud Storage object.
    ///
    /// # Errors
    /// When it does not start or does not say its port.
    pub fn start(python: &Path, upstream: u16, gcs_delete_precondition: bool) -> Result<Self> {
        let dir = server_dir("proxy")?;
        let script = dir.path().join("serialising_proxy.py");
        std::fs::write(&script, SCRIPT).map_err(Error::io("write serialising_proxy.py"))?;
        let mut cmd = Command::new(python);
        cmd.arg(&script)
            .args(["--upstream", &upstream.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if gcs_delete_precondition {
            cmd.arg("--gcs-delete-precondition");
        }
        let mut child = spawn(cmd).map_err(|e| {
            Error::Missing(format!(
                "cannot start the serialising proxy with {} ({e})",
                python.display()
            ))
        })?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        match line.trim().parse() {
            Ok(port) => Ok(SerialisingProxy {
                port,
                child: Some(child),
                _dir: dir,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(Error::NotStarted(format!(
                    "the serialising proxy did not say its port (it printed {line:?})"
                )))
            }
        }
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for SerialisingProxy {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}
