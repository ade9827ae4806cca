//! An Azure Blob server for tests: Azurite ([`leasehold_servers::AzuriteServer`]), and the stores
//! the tests open on it with the development account
//! ([`leasehold::stores::azure::DEV_ACCOUNT`]).

use crate::servers::{ok, wrapper};
use leasehold::stores::azure::{AzureCredentials, AzureOptions, AzureStore, DEV_ACCOUNT};
use leasehold_servers as launch;
use std::sync::OnceLock;

pub use leasehold_servers::azurite_bin;

wrapper!(
    /// An Azurite Blob server on a free port, killed (SIGKILL by PID) on drop
    /// ([`launch::AzuriteServer`]).
    AzuriteServer = launch::AzuriteServer
);

impl AzuriteServer {
    /// Starts Azurite and waits until it answers.
    ///
    /// # Panics
    /// When Azurite is missing or does not come up in three starts.
    pub fn start() -> Self {
        Self(ok(launch::AzuriteServer::start()))
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
    /// [`env`](launch::AzuriteServer::env).
    pub async fn url(&self, container: &str, prefix: &str) -> String {
        self.store(container, prefix).await;
        format!("az://{container}/{prefix}")
    }
}

/// One Azurite server shared by the tests of a process.
pub fn shared_azurite() -> &'static AzuriteServer {
    static S: OnceLock<AzuriteServer> = OnceLock::new();
    S.get_or_init(AzuriteServer::start)
}
