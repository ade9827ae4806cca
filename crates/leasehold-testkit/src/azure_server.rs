//! An Azure Blob server for tests: Azurite (npm package `azurite`) on a free 127.0.0.1 port with
//! its data in memory, run in a temp dir, installed by `./scripts/test` under `target/azurite`, stopped by PID.
//!
//! Azurite checks every Shared Key signature, answers 409 to a second create and 412 to a stale
//! `If-Match` write or delete, and serves the published development account
//! ([`leasehold::stores::azure::DEV_ACCOUNT`]).

use crate::servers::{free_port, http_get, in_three_starts, server_dir, spawn, wait_up};
use leasehold::stores::azure::{AzureCredentials, AzureOptions, AzureStore, DEV_ACCOUNT};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

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
    /// # Panics
    /// When Azurite is missing or does not come up in three starts.
    pub fn start() -> Self {
        in_three_starts("azurite", Self::start_once)
    }

    fn start_once() -> Result<Self, String> {
        let dir = server_dir("azurite");
        let port = free_port();
        let bin = azurite_bin();
        if !bin.exists() {
            panic!("{} is missing: {INSTALL_HINT}", bin.display());
        }
        let log = std::fs::File::create(dir.path().join("log")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&bin);
        cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            // Blobs and metadata in memory: no disk write per request (Azurite refuses
            // `--location` with it); it runs in the temp dir all the same.
            .args(["--silent", "--skipApiVersionCheck", "--inMemoryPersistence"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = spawn(cmd)
            .unwrap_or_else(|e| panic!("cannot start {} ({e}): {INSTALL_HINT}", bin.display()));
        let up = wait_up(
            &mut child,
            &format!("azurite on port {port}"),
            Duration::from_secs(30),
            Duration::from_millis(25),
            || http_get(port, "/devstoreaccount1?comp=list").is_some(),
        );
        if let Err(why) = up {
            let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
            return Err(format!("{why}; its log:\n{log}"));
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

    /// The environment a process opening [`url`](Self::url) needs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("AZURE_STORAGE_CONNECTION_STRING", self.connection_string())]
    }

    /// The store on `container` (created) under `prefix`, opened in this process with the
    /// development account.
    pub async fn store(&self, container: &str, prefix: &str) -> AzureStore {
        let mut o = AzureOptions::new(container);
        o.prefix = prefix.into();
        o.endpoint = Some(self.endpoint());
        o.credentials = Some(AzureCredentials::new(DEV_ACCOUNT.0, DEV_ACCOUNT.1));
        let store = AzureStore::connect(o).expect("Azure store");
        store.create_container().await.expect("create container");
        store
    }

    /// The URL of the store on `container` (created) under `prefix`; a process opening it needs
    /// [`env`](Self::env).
    pub async fn url(&self, container: &str, prefix: &str) -> String {
        self.store(container, prefix).await;
        format!("az://{container}/{prefix}")
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for AzuriteServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One Azurite server shared by the tests of a process.
pub fn shared_azurite() -> &'static AzuriteServer {
    static S: OnceLock<AzuriteServer> = OnceLock::new();
    S.get_or_init(AzuriteServer::start)
}
