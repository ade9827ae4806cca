//! `fake-gcs-server`, the Cloud Storage emulator, on a free loopback port behind the serialising
//! proxy ([`leasehold_servers::GcsServer`], whose documentation says why): the real server the
//! GCS store's tests talk to.

use crate::servers::{ok, wrapper};
use leasehold_servers as launch;
use std::path::PathBuf;
use std::sync::OnceLock;

pub use leasehold_servers::BUCKET;

/// The `fake-gcs-server` binary the venv's wrapper package ships.
///
/// # Panics
/// When the package is missing, saying how to install it.
pub fn gcs_bin() -> PathBuf {
    ok(launch::gcs_bin())
}

wrapper!(
    /// A `fake-gcs-server` with the bucket [`BUCKET`], behind the serialising proxy
    /// ([`launch::GcsServer`]).
    GcsServer = launch::GcsServer
);

impl GcsServer {
    /// Starts one and creates [`BUCKET`].
    ///
    /// # Panics
    /// When the binary is missing or the server does not answer within 10 s.
    pub fn start() -> Self {
        Self(ok(launch::GcsServer::start()))
    }

    /// Creates bucket `name`.
    ///
    /// # Panics
    /// When the server refuses.
    pub fn create_bucket(&self, name: &str) {
        ok(self.0.create_bucket(name))
    }

    /// Writes object `name` of [`BUCKET`] by a raw multipart upload
    /// ([`launch::GcsServer::put_raw`]): the status and the new generation (empty when refused).
    ///
    /// # Panics
    /// When the server does not answer.
    pub fn put_raw(&self, name: &str, body: &str, generation: Option<&str>) -> (u16, String) {
        ok(self.0.put_raw(name, body, generation))
    }
}

/// One emulator shared by a test process (never stopped; it dies with the process).
pub fn shared_gcs() -> &'static GcsServer {
    static S: OnceLock<GcsServer> = OnceLock::new();
    S.get_or_init(GcsServer::start)
}
