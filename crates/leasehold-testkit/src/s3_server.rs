//! An S3 server for tests: moto ([`leasehold_servers::MotoServer`]), perhaps behind the
//! serialising proxy, and the stores the tests open on it.

use crate::servers::{ok, wrapper};
use leasehold::stores::s3::{AwsCredentials, S3Options, S3Store};
use leasehold_servers as launch;
use std::sync::OnceLock;
use std::time::Duration;

pub use leasehold_servers::{moto_python, ACCESS_KEY};

wrapper!(
    /// A moto S3 server on a free port, perhaps behind the serialising proxy
    /// ([`launch::MotoServer`]).
    MotoServer = launch::MotoServer
);

impl MotoServer {
    /// Starts moto and waits until it answers.
    ///
    /// # Panics
    /// When moto is missing or does not come up in three starts.
    pub fn start() -> Self {
        Self(ok(launch::MotoServer::start()))
    }

    /// Starts moto behind the serialising proxy.
    ///
    /// # Panics
    /// When moto or the proxy does not start.
    pub fn start_serialised() -> Self {
        Self(ok(launch::MotoServer::start_serialised()))
    }

    /// Starts moto patched so that concurrent conditional writes race
    /// ([`launch::MotoServer::start_with_racing_writes`]).
    ///
    /// # Panics
    /// When moto does not start.
    pub fn start_with_racing_writes(delay: Duration) -> Self {
        Self(ok(launch::MotoServer::start_with_racing_writes(delay)))
    }

    /// This server behind a serialising proxy started now ([`launch::MotoServer::serialised`]).
    ///
    /// # Panics
    /// When the proxy does not start.
    pub fn serialised(self) -> Self {
        Self(ok(self.0.serialised()))
    }

    /// Creates `bucket` (nothing happens if it exists).
    ///
    /// # Panics
    /// When moto does not answer 200.
    pub fn create_bucket(&self, bucket: &str) {
        ok(self.0.create_bucket(bucket))
    }

    /// The URL of the store on `bucket` (created) under `prefix`.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        ok(self.0.url(bucket, prefix))
    }

    /// The store on `bucket` (created) under `prefix` on moto itself, never through the proxy.
    pub fn raw_store(&self, bucket: &str, prefix: &str) -> S3Store {
        self.store_at(self.raw_endpoint(), bucket, prefix)
    }

    /// The store on `bucket` (created) under `prefix`, opened in this process with the test
    /// access key.
    pub fn store(&self, bucket: &str, prefix: &str) -> S3Store {
        self.store_at(self.endpoint(), bucket, prefix)
    }

    fn store_at(&self, endpoint: String, bucket: &str, prefix: &str) -> S3Store {
        self.create_bucket(bucket);
        let mut o = S3Options::new(bucket);
        o.prefix = prefix.into();
        o.endpoint = Some(endpoint);
        o.region = Some("us-east-1".into());
        o.credentials = Some(AwsCredentials::new(ACCESS_KEY.0, ACCESS_KEY.1, None));
        S3Store::connect(o).expect("S3 store")
    }
}

/// One moto server shared by the tests of a process.
pub fn shared_moto() -> &'static MotoServer {
    static S: OnceLock<MotoServer> = OnceLock::new();
    S.get_or_init(MotoServer::start)
}

/// One moto for the whole test process, behind the serialising proxy (one request in flight to
/// moto at a time), where the conformance suite runs: moto serves concurrent requests on
/// threads that race on its own state (a write beside a listing has answered HTTP 500), and
/// checks a conditional write and makes it in two steps, so S3's exclusion is proven there.
pub fn shared_serialised_moto() -> &'static MotoServer {
    static S: OnceLock<MotoServer> = OnceLock::new();
    S.get_or_init(MotoServer::start_serialised)
}
