//! An Azure Blob server: Azurite (npm package `azurite`) on a free 127.0.0.1 port with its data in
//! memory, run in a temp dir (`LEASEHOLD_AZURITE` names its `azurite-blob`; `./scripts/test`
//! installs it under `target/azurite`), stopped by PID.
//!
//! Azurite checks every Shared Key signature, answers 409 to a second create and 412 to a stale
//! `If-Match` write or delete, and serves the published development account ([`DEV_ACCOUNT`]).

use crate::error::{Error, Result};
use crate::http::http_get;
use crate::process::{free_port, in_three_starts, kill, server_dir, spawn, wait_up, Pausable};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Azurite's development account and its published key (every Azure emulator serves it).
pub const DEV_ACCOUNT: (&str, &str) = (
    "devstoreaccount1",
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
);

/// `azurite-blob`: `LEASEHOLD_AZURITE` (the program), else `target/azurite/node_modules/.bin/
/// azurite-blob` of the workspace (`./scripts/test` installs it there).
pub fn azurite_bin() -> PathBuf {
    std::env::var_os("LEASEHOLD_AZURITE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/azurite/node_modules/.bin/azurite-blob"
            ))
        })
}

const INSTALL_HINT: &str = "run ./scripts/test (it installs Azurite with `npm install azurite` under target/azurite), or set LEASEHOLD_AZURITE to an azurite-blob program";

/// An Azurite Blob server on a free port, killed (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct AzuriteServer {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl AzuriteServer {
    /// Starts Azurite and waits until it answers.
    ///
    /// # Errors
    /// When Azurite is missing or does not come up in three starts.
    pub fn start() -> Result<Self> {
        in_three_starts("azurite", Self::start_once)
    }

    fn start_once() -> Result<Self> {
        let dir = server_dir("azurite")?;
        let port = free_port()?;
        let bin = azurite_bin();
        if !bin.exists() {
            return Err(Error::Missing(format!(
                "{} is missing: {INSTALL_HINT}",
                bin.display()
            )));
        }
        let log = std::fs::File::create(dir.path().join("log"))
            .map_err(Error::io("create Azurite's log"))?;
        let mut cmd = Command::new(&bin);
        cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            // Blobs and metadata in memory: no disk write per request (Azurite refuses
            // `--location` with it); it runs in the temp dir all the same.
            .args(["--silent", "--skipApiVersionCheck", "--inMemoryPersistence"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = spawn(cmd).map_err(|e| {
            Error::Missing(format!(
                "cannot start {} ({e}): {INSTALL_HINT}",
                bin.display()
            ))
        })?;
        let up = wait_up(
            &mut child,
            &format!("azurite on port {port}"),
            Duration::from_secs(30),
            Duration::from_millis(25),
            || http_get(port, "/devstoreaccount1?comp=list").is_some(),
        );
        if let Err(why) = up {
            let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
            return Err(Error::NotStarted(format!("{why}; its log:\n{log}")));
        }
        Ok(AzuriteServer {
            port,
            child: Some(child),
            _dir: dir,
        })
    }

    /// The development account's Blob endpoint, `http://127.0.0.1:PORT/devstoreaccount1`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{}", self.port, DEV_ACCOUNT.0)
    }

    /// The connection string Azure's SDKs and the `az` CLI take for this server.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={};AccountKey={};BlobEndpoint={};",
            DEV_ACCOUNT.0,
            DEV_ACCOUNT.1,
            self.endpoint()
        )
    }

    /// The environment a process opening an `az://` store URL on this server needs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("AZURE_STORAGE_CONNECTION_STRING", self.connection_string())]
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Pausable for AzuriteServer {
    fn process(&self) -> Option<u32> {
        self.pid()
    }
}

impl Drop for AzuriteServer {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}
