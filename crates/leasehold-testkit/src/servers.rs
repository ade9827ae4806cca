//! Real servers for tests: the launchers of the `leasehold-servers` crate, started on free
//! 127.0.0.1 ports, in temp dirs, and stopped by PID.
//!
//! The launchers return errors; the types here wrap them (each derefs to the launcher's own) so
//! that a server that cannot start fails the test loudly, with the launcher's message naming what
//! is missing (run `./scripts/test`, which installs it); no test is ever skipped for lack of a
//! server. The `shared_*` functions give one server per test process.
//!
//! Servers are started from one long-lived launcher thread with `PR_SET_PDEATHSIG`, so they die
//! with the test process even when it is killed; every server also stops on drop.

use leasehold_servers as launch;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

pub use leasehold_servers::{
    command_on, commands_on, http_get, http_request, pg_roles, redlock_url_of, Error, Pausable,
    SentinelServer, CLIENT_EXT, LOCKER_ACL, SENTINEL_MASTER,
};

/// The value of a launcher's result; a launcher's error fails the test with its message.
pub(crate) fn ok<T>(result: Result<T, Error>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

/// A test-kit type wrapping a launcher's (`$launcher`), which it derefs to.
macro_rules! wrapper {
    ($(#[$doc:meta])* $name:ident = $launcher:path) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(pub $launcher);

        impl std::ops::Deref for $name {
            type Target = $launcher;
            fn deref(&self) -> &$launcher {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut $launcher {
                &mut self.0
            }
        }
    };
}
pub(crate) use wrapper;

/// A free loopback port (bound and released; the server binds it right after).
pub fn free_port() -> u16 {
    ok(launch::free_port())
}

/// A loopback TCP server that is not Redis: it answers whatever it reads with an HTTP error
/// followed by bytes that are not text (a misconfigured port, a proxy in the way), on every
/// connection, until dropped. Dropped, it closes its listener and every connection, and returns
/// once the port is free again (a real server can then be started on it).
#[derive(Debug)]
pub struct GarbageServer {
    /// Its loopback port.
    pub port: u16,
    stopping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    connections: std::sync::Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl GarbageServer {
    /// Starts one on a free port.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub fn start() -> Self {
        Self::start_on(0)
    }

    /// Starts one on `port` (where a stopped server listened; 0: a free port).
    ///
    /// # Panics
    /// When the port cannot be bound.
    pub fn start_on(port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("cannot bind loopback port {port}: {e}"));
        let port = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no local address: {e}"));
        let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connections = std::sync::Arc::new(Mutex::new(Vec::<TcpStream>::new()));
        let (stop, open) = (stopping.clone(), connections.clone());
        let acceptor = std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                if let (Ok(mut s), Ok(kept)) = (s.try_clone(), s.try_clone()) {
                    if let Ok(mut open) = open.lock() {
                        open.push(kept);
                    }
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        while matches!(s.read(&mut buf), Ok(n) if n > 0) {
                            if s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n\x00\xff garbage")
                                .is_err()
                            {
                                break;
                            }
                        }
                    });
                }
            }
        });
        GarbageServer {
            port,
            stopping,
            connections,
            acceptor: Some(acceptor),
        }
    }
}

impl Drop for GarbageServer {
    fn drop(&mut self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the acceptor, which then sees the flag and drops the listener.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        if let Ok(mut open) = self.connections.lock() {
            for s in open.drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

wrapper!(
    /// A `redis-server` on a free port (and a Unix socket in its directory) with no persistence,
    /// stopped (SIGKILL by PID) on drop ([`launch::RedisServer`]).
    RedisServer = launch::RedisServer
);

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` is missing or does not come up within 10 s.
    pub fn start() -> Self {
        Self(ok(launch::RedisServer::start()))
    }

    /// Starts a server on `port` (to restart one in place).
    pub fn start_on(port: u16) -> Self {
        Self(ok(launch::RedisServer::start_on(port)))
    }

    /// Starts a server with ACL users besides the default one; each entry is a `user` line of
    /// `redis.conf`, e.g. [`LOCKER_ACL`].
    pub fn start_with_users(users: &[&str]) -> Self {
        Self(ok(launch::RedisServer::start_with_users(users)))
    }

    /// Starts a server that speaks only TLS ([`launch::RedisServer::start_tls`]).
    pub fn start_tls() -> Self {
        Self(ok(launch::RedisServer::start_tls()))
    }

    /// Starts a TLS server that requires a client certificate
    /// ([`launch::RedisServer::start_mtls`]).
    pub fn start_mtls() -> Self {
        Self(ok(launch::RedisServer::start_mtls()))
    }

    /// Waits until this server, a replica, is synced.
    ///
    /// # Panics
    /// When it has not within 10 s.
    pub async fn synced_as_replica(&self) {
        ok(self.0.synced_as_replica().await)
    }

    /// Waits until a client of this server is blocked (in `WAIT`, say).
    ///
    /// # Panics
    /// When none is within 10 s.
    pub async fn a_client_blocked(&self) {
        ok(self.0.a_client_blocked().await)
    }

    /// Waits until `replica` has received everything this primary had written when called.
    ///
    /// # Panics
    /// When it has not within 10 s.
    pub async fn replicated_to(&self, replica: &launch::RedisServer) {
        ok(self.0.replicated_to(replica).await)
    }
}

wrapper!(
    /// A Sentinel deployment: a primary with one replica, watched by three sentinels
    /// ([`launch::SentinelSet`]).
    SentinelSet = launch::SentinelSet
);

impl SentinelSet {
    /// Starts the servers and sentinels and waits until the deployment has settled.
    ///
    /// # Panics
    /// When a process cannot start or the deployment does not settle within 30 s.
    pub fn start() -> Self {
        Self(ok(launch::SentinelSet::start()))
    }

    /// [`SentinelSet::start`] with sentinels that require `password`.
    pub fn start_with_password(password: Option<&str>) -> Self {
        Self(ok(launch::SentinelSet::start_with_password(password)))
    }

    /// [`SentinelSet::start`] over TLS only.
    pub fn start_tls() -> Self {
        Self(ok(launch::SentinelSet::start_tls()))
    }

    /// Waits until every other data server has received what the one on `primary` had written.
    ///
    /// # Panics
    /// When `primary` is not one of the set's servers, or a replica lags 10 s.
    pub async fn replicated_from(&self, primary: u16) {
        ok(self.0.replicated_from(primary).await)
    }
}

/// A Sentinel deployment shared by all tests of this process.
pub fn shared_sentinels() -> &'static SentinelSet {
    static SET: OnceLock<SentinelSet> = OnceLock::new();
    SET.get_or_init(SentinelSet::start)
}

/// A TLS-only Redis server that requires a client certificate ([`RedisServer::start_mtls`])
/// shared by all tests of this process.
pub fn shared_redis_mtls() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start_mtls)
}

/// A TLS-only Sentinel deployment ([`SentinelSet::start_tls`]) shared by all tests of this
/// process.
pub fn shared_tls_sentinels() -> &'static SentinelSet {
    static SET: OnceLock<SentinelSet> = OnceLock::new();
    SET.get_or_init(SentinelSet::start_tls)
}

wrapper!(
    /// A Redis Cluster on loopback: three primaries and a replica of each
    /// ([`launch::RedisCluster`]).
    RedisCluster = launch::RedisCluster
);

impl RedisCluster {
    /// Starts six nodes, creates the cluster and waits until it has settled.
    ///
    /// # Panics
    /// When a node cannot start, `redis-cli --cluster create` fails, or the cluster does not
    /// settle within 30 s.
    pub fn start() -> Self {
        Self(ok(launch::RedisCluster::start()))
    }

    /// [`RedisCluster::start`] with nodes that speak only TLS.
    pub fn start_tls() -> Self {
        Self(ok(launch::RedisCluster::start_tls()))
    }
}

/// A Redis Cluster shared by all tests of this process.
pub fn shared_redis_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

/// One Redis server shared by all tests of this process (each test uses its own key prefix).
pub fn shared_redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// Five Redis servers shared by all tests of this process, for Redlock (3 nodes use the first
/// three).
pub fn shared_redis_nodes() -> &'static [RedisServer] {
    static SERVERS: OnceLock<Vec<RedisServer>> = OnceLock::new();
    SERVERS.get_or_init(|| (0..5).map(|_| RedisServer::start()).collect())
}

/// `redlock://127.0.0.1:P1,…/0` over `servers`.
pub fn redlock_url(servers: &[RedisServer]) -> String {
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    redlock_url_of(&ports)
}

/// A key and a certificate for `subject` (`name.key`, `name.crt` in `dir`), signed by the CA
/// of `dir` ([`launch::sign_cert`]).
///
/// # Panics
/// When openssl is missing or fails.
pub fn sign_cert(dir: &Path, name: &str, subject: &str, ext: &str) {
    ok(launch::sign_cert(dir, name, subject, ext))
}

/// A fresh CA with server and client certificates in a new temp dir ([`launch::test_certs`]).
///
/// # Panics
/// When openssl is missing or fails.
pub fn test_certs() -> tempfile::TempDir {
    ok(launch::test_certs())
}

wrapper!(
    /// A single-member etcd on free client and peer ports ([`launch::EtcdServer`]).
    EtcdServer = launch::EtcdServer
);

impl EtcdServer {
    /// Starts etcd and waits until `/health` says it is healthy.
    ///
    /// # Panics
    /// When `etcd` is missing, or none of three starts comes up.
    pub fn start() -> Self {
        Self(ok(launch::EtcdServer::start()))
    }
}

/// `LEASEHOLD_APISERVER` (a `leasehold-apiserver` program) when set; else builds
/// `leasehold-apiserver` (once per process, a no-op when it is fresh) in the profile of the running
/// test or benchmark and returns its path.
///
/// # Panics
/// When cargo cannot build it.
pub fn apiserver_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(bin) = std::env::var_os("LEASEHOLD_APISERVER").filter(|b| !b.is_empty()) {
                return PathBuf::from(bin);
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let path = crate::workspace_bin("leasehold-apiserver");
            // Built in the profile of the running test or benchmark (target/debug or
            // target/release), where `workspace_bin` looks for it.
            let release = path
                .parent()
                .is_some_and(|d| d.file_name().is_some_and(|n| n == "release"));
            let mut args = vec!["build", "--quiet", "-p", "leasehold-apiserver"];
            if release {
                args.push("--release");
            }
            let status = Command::new(cargo)
                .args(&args)
                .status()
                .unwrap_or_else(|e| panic!("cannot run cargo to build leasehold-apiserver: {e}"));
            assert!(
                status.success(),
                "building leasehold-apiserver failed (run from the workspace, or set LEASEHOLD_APISERVER to a leasehold-apiserver program: cargo build -p leasehold-apiserver)"
            );
            path
        })
        .clone()
}

wrapper!(
    /// `leasehold-apiserver` on a free port over its own etcd ([`launch::ApiServer`]), the
    /// program from [`apiserver_bin`].
    ApiServer = launch::ApiServer
);

impl ApiServer {
    /// Starts etcd and the API server and waits until `/healthz` answers.
    ///
    /// # Panics
    /// When etcd or the API server cannot start or does not come up within 20 s.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts one with extra arguments (`["--deny", "update"]` to refuse a verb as RBAC would).
    pub fn start_with(args: &[&str]) -> Self {
        Self(ok(launch::ApiServer::start_program(&apiserver_bin(), args)))
    }

    /// Writes a kubeconfig pointing at this server (namespace `ns`) and returns its path.
    pub fn kubeconfig(&self, ns: &str) -> PathBuf {
        ok(self.0.kubeconfig(ns))
    }

    /// Lease API requests served since start or the last reset, from `/debug/requests`.
    pub fn requests(&self) -> serde_json::Value {
        ok(self.0.requests())
    }
}

/// One API server (over one etcd) shared by all tests of this process (each test uses its own
/// namespace or key prefix).
pub fn shared_apiserver() -> &'static ApiServer {
    static SERVER: OnceLock<ApiServer> = OnceLock::new();
    SERVER.get_or_init(ApiServer::start)
}

/// The directory of the newest installed PostgreSQL's programs (`/usr/lib/postgresql/N/bin`).
///
/// # Panics
/// When PostgreSQL is not installed, naming the package.
pub fn postgres_bin() -> PathBuf {
    ok(launch::postgres_bin())
}

wrapper!(
    /// A PostgreSQL server on a free 127.0.0.1 port ([`launch::PostgresServer`]).
    PostgresServer = launch::PostgresServer
);

impl PostgresServer {
    /// Runs `initdb` and starts `postgres`, waiting until it accepts connections.
    ///
    /// # Panics
    /// When PostgreSQL is missing, `initdb` fails, or the server is not ready within 30 s.
    pub fn start() -> Self {
        Self(ok(launch::PostgresServer::start()))
    }

    /// As [`PostgresServer::start`], with TLS on and required
    /// ([`launch::PostgresServer::start_tls`]).
    pub fn start_tls() -> Self {
        Self(ok(launch::PostgresServer::start_tls()))
    }

    /// The file `name` of a TLS server's certificates directory.
    ///
    /// # Panics
    /// On a server started without TLS.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.0
            .cert(name)
            .unwrap_or_else(|| panic!("the server was started without TLS"))
    }

    /// Creates a fresh database with a random name and returns its URL.
    pub fn fresh_db(&self) -> String {
        ok(self.0.fresh_db())
    }
}

/// One PostgreSQL server shared by all tests of this process (each test uses its own database).
pub fn shared_postgres() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::start)
}

/// One TLS PostgreSQL server ([`PostgresServer::start_tls`]) shared by all tests of this process.
pub fn shared_postgres_tls() -> &'static PostgresServer {
    static SERVER: OnceLock<PostgresServer> = OnceLock::new();
    SERVER.get_or_init(PostgresServer::start_tls)
}
