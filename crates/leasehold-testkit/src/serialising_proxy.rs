//! The test kit's serialising HTTP proxy (`py/serialising_proxy.py`): it passes requests to an
//! emulator one at a time over one connection, so that the emulator checks each conditional
//! write against the state the previous write left, as the real service does. Cloud Storage
//! ([`crate::gcs_server`]) adds its DELETE precondition check; S3 on moto
//! ([`crate::s3_server::MotoServer::start_serialised`]) needs only the serialising.

use crate::servers::spawn;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The proxy process in front of an emulator, killed (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct SerialisingProxy {
    port: u16,
    child: Option<Child>,
}

impl SerialisingProxy {
    /// Starts the proxy with `python` (standard library only) in front of the emulator on
    /// `upstream`; with `gcs_delete_precondition`, it also enforces `ifGenerationMatch` on a
    /// DELETE of a Cloud Storage object.
    ///
    /// # Panics
    /// When it does not start or does not say its port.
    pub fn start(python: &Path, upstream: u16, gcs_delete_precondition: bool) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("py")
            .join("serialising_proxy.py");
        let mut cmd = Command::new(python);
        cmd.arg(&script)
            .args(["--upstream", &upstream.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if gcs_delete_precondition {
            cmd.arg("--gcs-delete-precondition");
        }
        let mut child = spawn(cmd).unwrap_or_else(|e| {
            panic!(
                "cannot start {} with {} ({e})",
                script.display(),
                python.display()
            )
        });
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        match line.trim().parse() {
            Ok(port) => SerialisingProxy {
                port,
                child: Some(child),
            },
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the serialising proxy {} did not say its port (it printed {line:?})",
                    script.display()
                )
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
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
