//! PostgreSQL: a cluster made by `initdb` in a temp dir, plain or with TLS required.

use crate::certs::{make_certs, sign_cert, CLIENT_EXT};
use crate::error::{Error, Result};
use crate::process::{
    free_port, in_three_starts, kill, server_dir, signal, spawn, wait_up, with_log, Pausable,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How to install PostgreSQL.
const INSTALL_HINT: &str =
    "install it with `apt-get install postgresql`, or run ./scripts/test which does";

/// The directory of the newest installed PostgreSQL's programs (`/usr/lib/postgresql/N/bin`).
///
/// # Errors
/// An [`Error::Missing`] when PostgreSQL is not installed, naming the package.
pub fn postgres_bin() -> Result<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).ok_or_else(|| {
        Error::Missing(format!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/N/bin/initdb): {INSTALL_HINT}"
        ))
    })
}

/// The uid and gid the server runs as: the `postgres` user when we are root (PostgreSQL refuses
/// to run as root), else ourselves.
fn postgres_ids() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated name; the returned entry is read at once, before any other
    // getpw* call of this thread.
    let pw = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    if pw.is_null() {
        return Err(Error::Missing(
            "no `postgres` user to run PostgreSQL as (apt-get install postgresql creates it)"
                .into(),
        ));
    }
    // SAFETY: pw is non-null and points to a valid passwd entry.
    Ok(Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) }))
}

/// A PostgreSQL server on a free 127.0.0.1 port, in a temp dir the `postgres` user can reach
/// (under /tmp), with `fsync=off`; stopped (SIGKILL by PID) on drop and when this process dies.
#[derive(Debug)]
pub struct PostgresServer {
    /// Its port.
    pub port: u16,
    child: Option<Child>,
    bin: PathBuf,
    /// For a server started with [`PostgresServer::start_tls`]: the directory of its certificates.
    certs: Option<PathBuf>,
    /// The uid and gid it runs as, when not ours.
    ids: Option<(u32, u32)>,
    /// Its `-c` settings beyond the common ones (to start it again alike).
    settings: Vec<String>,
    _dir: tempfile::TempDir,
}

/// Starts `postgres` on `port` over the cluster `dir/data` (socket and log in `dir`) and waits
/// until `pg_isready` says it accepts connections; an error with its log when it exits or is not
/// ready within 30 s (the process is then killed and reaped).
fn postgres_launch(
    bin: &Path,
    dir: &Path,
    port: u16,
    settings: &[String],
    ids: Option<(u32, u32)>,
) -> Result<Child> {
    let log = std::fs::File::create(dir.join("log")).map_err(Error::io("create postgres's log"))?;
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string(), "-k"])
        .arg(dir)
        .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        .args(["-c", "full_page_writes=off", "-c", "max_connections=200"])
        .args(settings.iter().flat_map(|s| ["-c", s.as_str()]))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log);
    if let Some((uid, gid)) = ids {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    let mut child = spawn(cmd)
        .map_err(|e| Error::Missing(format!("cannot start postgres ({e}): {INSTALL_HINT}")))?;
    // `pg_isready`: it accepts connections.
    let ready = || {
        Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    };
    let what = format!("postgres on port {port}");
    wait_up(
        &mut child,
        &what,
        Duration::from_secs(30),
        Duration::from_millis(20),
        ready,
    )
    .map(|()| child)
    .map_err(|why| Error::NotStarted(with_log(&why, &dir.join("log"))))
}

/// The roles a TLS server ([`PostgresServer::start_tls`]) has besides `postgres`.
pub mod pg_roles {
    /// Logs in with a client certificate only (`hostssl … cert`; its certificate is
    /// `locker.crt` / `locker.key` in [`super::PostgresServer::cert`]'s directory).
    pub const CERT: &str = "locker";
    /// Logs in with a password only, by SCRAM-SHA-256 (`hostssl … scram-sha-256`).
    pub const SCRAM: &str = "scrammer";
    /// The password of [`SCRAM`].
    pub const SCRAM_PASSWORD: &str = "s3cret-pass";
}

impl PostgresServer {
    /// Runs `initdb` and starts `postgres`, waiting until `pg_isready` says it accepts
    /// connections.
    ///
    /// # Errors
    /// When PostgreSQL is missing, `initdb` fails, or the server is not ready within 30 s.
    pub fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// As [`PostgresServer::start`], with TLS on (a CA and certificates of the test kit's own)
    /// and required: `pg_hba.conf` refuses every TCP connection without TLS. Over TLS, `postgres`
    /// is trusted, [`pg_roles::CERT`] needs a client certificate the CA signed, and
    /// [`pg_roles::SCRAM`] a password (both superusers). [`PostgresServer::url`] then gives a
    /// `sslmode=verify-full` URL.
    ///
    /// # Errors
    /// As [`PostgresServer::start`], and when openssl is missing or fails.
    pub fn start_tls() -> Result<Self> {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Result<Self> {
        let bin = postgres_bin()?;
        let ids = postgres_ids()?;
        let dir = server_dir("pg")?;
        let chown = |path: &Path| match ids {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(Error::io(format!("chown {}", path.display()))),
            None => Ok(()),
        };
        let as_server = |cmd: &mut Command| {
            use std::os::unix::process::CommandExt;
            if let Some((uid, gid)) = ids {
                cmd.uid(uid).gid(gid);
            }
        };
        chown(dir.path())?;
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .current_dir(dir.path());
        as_server(&mut initdb);
        let out = initdb
            .output()
            .map_err(|e| Error::Missing(format!("cannot run initdb ({e}): {INSTALL_HINT}")))?;
        if !out.status.success() {
            return Err(Error::Setup(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let mut settings: Vec<String> = vec![];
        let mut certs = None;
        if tls {
            let dir = dir.path().join("certs");
            std::fs::create_dir(&dir).map_err(Error::io("mkdir certs"))?;
            make_certs(&dir)?;
            sign_cert(
                &dir,
                "locker",
                &format!("/CN={}", pg_roles::CERT),
                CLIENT_EXT,
            )?;
            // The server's key: the server's own, readable by it alone (PostgreSQL checks).
            let key = dir.join("server.key");
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(Error::io("chmod server.key"))?;
            chown(&dir)?;
            chown(&key)?;
            let certs_dir = dir;
            for (name, file) in [
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
                ("ssl_ca_file", "ca.crt"),
            ] {
                settings.push(format!("{name}={}", certs_dir.join(file).display()));
            }
            settings.push("ssl=on".into());
            let hba = format!(
                "local all all trust\n\
                 hostssl all {cert} 127.0.0.1/32 cert\n\
                 hostssl all {scram} 127.0.0.1/32 scram-sha-256\n\
                 hostssl all all 127.0.0.1/32 trust\n\
                 host all all 127.0.0.1/32 reject\n",
                cert = pg_roles::CERT,
                scram = pg_roles::SCRAM,
            );
            std::fs::write(data.join("pg_hba.conf"), hba)
                .map_err(Error::io("write pg_hba.conf"))?;
            certs = Some(certs_dir);
        }
        // Up to three starts, each on a new port: another process can take a port between
        // `free_port` and the server's bind. The data directory is kept.
        let (port, child) = in_three_starts("postgres", || {
            let port = free_port()?;
            postgres_launch(&bin, dir.path(), port, &settings, ids).map(|child| (port, child))
        })?;
        let server = PostgresServer {
            port,
            child: Some(child),
            bin,
            certs,
            ids,
            settings,
            _dir: dir,
        };
        if tls {
            let roles = format!(
                "CREATE ROLE {} LOGIN SUPERUSER; CREATE ROLE {} LOGIN SUPERUSER PASSWORD '{}'",
                pg_roles::CERT,
                pg_roles::SCRAM,
                pg_roles::SCRAM_PASSWORD
            );
            if server.psql("postgres", &roles).is_none() {
                return Err(Error::Setup("cannot create the TLS server's roles".into()));
            }
        }
        Ok(server)
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`; on a TLS server
    /// ([`PostgresServer::start_tls`]), with `?sslmode=verify-full&sslrootcert=…/ca.crt`.
    pub fn url(&self, db: &str) -> String {
        let plain = format!("postgres://postgres@127.0.0.1:{}/{db}", self.port);
        match &self.certs {
            Some(certs) => format!(
                "{plain}?sslmode=verify-full&sslrootcert={}",
                certs.join("ca.crt").display()
            ),
            None => plain,
        }
    }

    /// The directory of the server's Unix socket (`.s.PGSQL.PORT`): a URL reaches it with
    /// `?host=DIR&port=PORT`.
    pub fn socket_dir(&self) -> &Path {
        self._dir.path()
    }

    /// The file `name` of a TLS server's certificates directory (`ca.crt`, `server.crt`,
    /// `client.crt` / `client.key` signed by the CA for a subject no role has, `locker.crt` /
    /// `locker.key` for [`pg_roles::CERT`]).
    ///
    /// `None` on a server started without TLS.
    pub fn cert(&self, name: &str) -> Option<PathBuf> {
        self.certs.as_ref().map(|dir| dir.join(name))
    }

    /// Creates a fresh database with a random name and returns its URL.
    ///
    /// # Errors
    /// When `createdb` cannot be run or fails.
    pub fn fresh_db(&self) -> Result<String> {
        let name = format!("t{:016x}", fastrand::u64(..));
        let out = Command::new(self.bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", &name])
            .output()
            .map_err(|e| Error::Missing(format!("cannot run createdb ({e}): {INSTALL_HINT}")))?;
        if !out.status.success() {
            return Err(Error::Setup(format!(
                "createdb {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(self.url(&name))
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        kill(&mut self.child);
    }

    /// Stops the server with a fast shutdown (SIGINT: it ends every session, writes a checkpoint
    /// and exits) and waits for it; [`PostgresServer::start_again`] brings it back.
    pub fn stop_fast(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = libc::pid_t::try_from(c.id()) {
                // SAFETY: kill(2) on our own child's pid (not yet reaped).
                unsafe { libc::kill(pid, libc::SIGINT) };
            }
            let _ = c.wait();
        }
    }

    /// Starts a stopped server again, on its port and over its data.
    ///
    /// # Errors
    /// When it does not accept connections within 30 s (another process took its port, say).
    pub fn start_again(&mut self) -> Result<()> {
        if self.child.is_none() {
            let child = postgres_launch(
                &self.bin,
                self._dir.path(),
                self.port,
                &self.settings,
                self.ids,
            )?;
            self.child = Some(child);
        }
        Ok(())
    }

    /// Runs `sql` in database `db` with `psql` as the `postgres` user: its output, unaligned and
    /// without headers (one value per line), or `None` when `psql` fails.
    pub fn psql(&self, db: &str, sql: &str) -> Option<String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db, "-XAtc", sql])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Sends `sig` to every process of the server: the postmaster and its children (one backend
    /// per connection, the background workers), so that SIGSTOP hangs the whole server.
    fn signal_all(&self, sig: i32) {
        let Some(postmaster) = self.pid() else {
            return;
        };
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // `pid (comm) state ppid …`: the parent is the second field after the comm.
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        for pid in pids {
            signal(Some(pid), sig);
        }
    }
}

/// Paused, every process of the server hangs: the postmaster, each connection's backend and the
/// background workers.
impl Pausable for PostgresServer {
    fn process(&self) -> Option<u32> {
        self.pid()
    }

    fn pause(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    fn resume(&self) {
        self.signal_all(libc::SIGCONT);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}
