//! Other clients of the same stores, run as the seeds' services run them: the official Kubernetes
//! Python client's leader election (`kubernetes.leaderelection` with a `LeaseLock`), redis-py's
//! `Lock` and the single-waiter Cloud Storage lock over the official `google-cloud-storage` client,
//! started as real processes from the scripts in this crate's `py/` directory, and the
//! event log they share with the commands leasehold runs.
//!
//! Every process appends `<CLOCK_MONOTONIC ns> <who> <event>` lines to one [`EventLog`] (one
//! `write(2)` per line on an `O_APPEND` file): `start` and `end` bound the time a process works
//! under the lock, `renew` marks each successful write of a foreign client's lock, `lost` a foreign
//! client that could not keep its lock. [`EventLog::working`] checks that no two working intervals
//! overlap.
//!
//! The Python interpreter comes from `LEASEHOLD_PYTHON` (`./scripts/test` creates a venv under
//! `target/` with the `kubernetes` and `redis` packages and sets it), else that venv if it exists;
//! without either, or without those packages, the test fails saying how to get them.

use crate::servers::ApiServer;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The Python interpreter with the `kubernetes` and `redis` packages, checked once per process.
///
/// # Panics
/// When there is none, saying how to get one.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python");
            let python = match std::env::var_os("LEASEHOLD_PYTHON") {
                Some(p) if !p.is_empty() => PathBuf::from(p),
                _ if venv.exists() => venv,
                _ => panic!(
                    "LEASEHOLD_PYTHON is not set and {} does not exist: run ./scripts/test (it creates that venv with the `kubernetes` and `redis` packages), or set LEASEHOLD_PYTHON to a Python that has them",
                    venv.display()
                ),
            };
            imports(
                &python,
                "kubernetes.leaderelection.leaderelection, redis",
                "the `kubernetes` or `redis` package (pip install kubernetes redis; ./scripts/test installs them)",
            );
            python
        })
        .clone()
}

/// Checks that `python` can `import MODULES`.
///
/// # Panics
/// When it cannot, saying it lacks `what`.
fn imports(python: &Path, modules: &str, what: &str) {
    let out = Command::new(python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (LEASEHOLD_PYTHON): {e}", python.display()));
    assert!(
        out.status.success(),
        "{} lacks {what}: {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The path of the script `name` in this crate's `py/` directory.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("py").join(name)
}

/// A child process whose stdout lines and exit status are collected by threads; killed (SIGKILL
/// by its PID) on drop if it is still running.
#[derive(Debug)]
pub struct Proc {
    pid: i32,
    what: String,
    lines: Receiver<String>,
    seen: Vec<String>,
    exit: Receiver<ExitStatus>,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Starts `cmd` with stdout piped (stderr inherited, so its messages show in the test's output).
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn spawn(mut cmd: Command, what: &str) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("{what}: no stdout"));
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let pid = i32::try_from(child.id()).unwrap_or_else(|e| panic!("{what}: pid: {e}"));
        let (etx, exit) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(status) = child.wait() {
                let _ = etx.send(status);
            }
        });
        Proc {
            pid,
            what: what.to_owned(),
            lines,
            seen: vec![],
            exit,
            status: None,
        }
    }

    /// Waits up to `limit` for the stdout line `want`.
    ///
    /// # Panics
    /// When the process closes its stdout or `limit` passes first, with the lines it printed.
    pub fn wait_line(&mut self, want: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == want => return,
                Ok(line) => self.seen.push(line),
                Err(e) => panic!(
                    "{}: no line {want:?} ({e:?}); it printed {:?}",
                    self.what, self.seen
                ),
            }
        }
    }

    /// Kills the process (SIGKILL by its PID), as a machine that dies, and reaps it.
    ///
    /// # Panics
    /// When it is not gone within 10 s.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            // SAFETY: kill(2) on our own child, not reaped yet (the waiting thread reaps it).
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
        self.wait(Duration::from_secs(10));
    }

    /// Waits up to `limit` for the process to exit.
    ///
    /// # Panics
    /// When it is still running after `limit` (it is killed then).
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        match self.exit.recv_timeout(limit) {
            Ok(s) => {
                self.status = Some(s);
                s
            }
            Err(e) => panic!("{} did not exit within {limit:?} ({e:?})", self.what),
        }
    }

    /// Waits up to `limit` for the process to exit; its status and the stdout lines not yet
    /// read.
    ///
    /// # Panics
    /// When it is still running after `limit`.
    pub fn finish(&mut self, limit: Duration) -> (ExitStatus, String) {
        let status = self.wait(limit);
        let mut out = String::new();
        // Its stdout closed when it exited (nothing it started keeps it open): the reader
        // thread ends, and the channel with it.
        while let Ok(line) = self.lines.recv_timeout(limit) {
            out.push_str(&line);
            out.push('\n');
        }
        (status, out)
    }

    /// Waits up to `limit` for the process to exit and asserts it succeeded.
    ///
    /// # Panics
    /// When it did not exit, or exited unsuccessfully.
    pub fn succeeds(&mut self, limit: Duration) {
        let status = self.wait(limit);
        assert!(
            status.success(),
            "{} failed: {status}; it printed {:?}",
            self.what,
            self.seen
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() && self.exit.try_recv().is_err() {
            // SAFETY: kill(2) on our own child, which has not been reaped (no status yet).
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
    }
}

/// One line of an [`EventLog`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// CLOCK_MONOTONIC in nanoseconds (the host's one clock, see [`crate::mono_ns`]).
    pub ns: u64,
    /// Who wrote it.
    pub who: String,
    /// What happened: `start`, `end`, `renew`, `lost`.
    pub event: String,
}

/// The time one process worked under the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Working {
    /// Who.
    pub who: String,
    /// Its `start` line.
    pub start: u64,
    /// Its `end` line.
    pub end: u64,
}

/// A log file several processes append event lines to, in a temp dir removed on drop.
#[derive(Debug)]
pub struct EventLog {
    dir: tempfile::TempDir,
}

impl Default for EventLog {
    fn default() -> Self {
        Self::new()
    }
}

impl EventLog {
    /// A new, empty log.
    ///
    /// # Panics
    /// When no temp dir can be made.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-events-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        EventLog { dir }
    }

    /// The log file.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("events")
    }

    /// A scratch directory next to the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A command line that works `seconds` under a lock as `who`: logs `start`, prints
    /// `working`, logs `end` after `seconds` and exits 0 (for `leasehold run -- …`).
    pub fn worker(&self, who: &str, seconds: f64) -> Vec<String> {
        vec![
            python().display().to_string(),
            script("work.py").display().to_string(),
            self.path().display().to_string(),
            who.to_owned(),
            seconds.to_string(),
        ]
    }

    /// Every event so far, in clock order.
    ///
    /// # Panics
    /// On a line that is not `<ns> <who> <event>`.
    pub fn events(&self) -> Vec<Event> {
        let text = std::fs::read_to_string(self.path()).unwrap_or_default();
        let mut events: Vec<Event> = text
            .lines()
            .map(|l| {
                let mut f = l.split(' ');
                match (f.next().map(str::parse), f.next(), f.next(), f.next()) {
                    (Some(Ok(ns)), Some(who), Some(event), None) => Event {
                        ns,
                        who: who.to_owned(),
                        event: event.to_owned(),
                    },
                    _ => panic!("bad event line {l:?} in\n{text}"),
                }
            })
            .collect();
        events.sort_by_key(|e| e.ns);
        events
    }

    /// The last time `who` logged `event`.
    pub fn last(&self, who: &str, event: &str) -> Option<u64> {
        self.events()
            .iter()
            .filter(|e| e.who == who && e.event == event)
            .map(|e| e.ns)
            .max()
    }

    /// The working intervals in clock order, after checking that each `start` is followed by
    /// its own `end` before anyone else starts: nobody worked while another did, and nobody
    /// logged `lost`.
    ///
    /// # Panics
    /// When two intervals overlap, one is left open, or a client lost its lock; with the log.
    pub fn working(&self) -> Vec<Working> {
        let events = self.events();
        let shown = || self.shown();
        let mut out: Vec<Working> = vec![];
        let mut open: Option<(String, u64)> = None;
        for e in &events {
            match e.event.as_str() {
                "start" => {
                    if let Some((who, _)) = &open {
                        panic!("{} started while {who} was working:\n{}", e.who, shown());
                    }
                    open = Some((e.who.clone(), e.ns));
                }
                "end" => match open.take() {
                    Some((who, start)) if who == e.who => out.push(Working {
                        who,
                        start,
                        end: e.ns,
                    }),
                    _ => panic!("{} ended work it had not started:\n{}", e.who, shown()),
                },
                "lost" => panic!("{} lost its lock:\n{}", e.who, shown()),
                _ => {}
            }
        }
        if let Some((who, _)) = open {
            panic!("{who} never ended its work:\n{}", shown());
        }
        out
    }

    /// The log as lines of seconds since its first event (for messages).
    pub fn shown(&self) -> String {
        let events = self.events();
        let t0 = events.first().map_or(0, |e| e.ns);
        events
            .iter()
            .map(|e| format!("{:>9.3} s  {} {}", (e.ns - t0) as f64 / 1e9, e.who, e.event))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Seconds of a lease a foreign client holds in these tests: its leaseDurationSeconds (Python's
/// leader election: renew deadline 2 s, retry period 1 s).
pub const FOREIGN_LEASE_SECONDS: u64 = 3;

/// Python leader election (`kubernetes.leaderelection`, a `LeaseLock` on Lease `name` in `ns` of
/// `api`, via a kubeconfig) as `identity`: logs to `log`, prints `leading` once it leads, works
/// `work` seconds, then exits without releasing (see `py/k8s_leader.py`).
pub fn k8s_leader(
    api: &ApiServer,
    ns: &str,
    name: &str,
    identity: &str,
    log: &EventLog,
    work: f64,
) -> Proc {
    let mut cmd = Command::new(python());
    cmd.arg(script("k8s_leader.py"))
        .arg("--kubeconfig")
        .arg(api.kubeconfig(ns))
        .args(["--namespace", ns, "--name", name, "--identity", identity])
        .arg("--log")
        .arg(log.path())
        .args(["--work", &work.to_string()])
        .args(["--lease-duration", &FOREIGN_LEASE_SECONDS.to_string()]);
    Proc::spawn(cmd, &format!("Python leader election as {identity}"))
}

/// redis-py's `Lock` on key `name` of every server in `ports` (one: a plain lock; several: every
/// Redlock node) as `identity`, with a TTL of `ttl_ms` extended every third of it: logs to `log`,
/// prints `locked` once it holds the lock, works `work` seconds, then exits without releasing
/// (see `py/redis_lock.py`).
pub fn redis_lock(
    ports: &[u16],
    name: &str,
    identity: &str,
    log: &EventLog,
    work: f64,
    ttl_ms: u64,
) -> Proc {
    let mut cmd = Command::new(python());
    cmd.arg(script("redis_lock.py"));
    for p in ports {
        cmd.args(["--port", &p.to_string()]);
    }
    cmd.args(["--name", name, "--identity", identity])
        .arg("--log")
        .arg(log.path())
        .args(["--work", &work.to_string()])
        .args(["--ttl-ms", &ttl_ms.to_string()]);
    Proc::spawn(cmd, &format!("redis-py Lock as {identity}"))
}

/// The Python of [`python`], checked to have the official `google-cloud-storage` package.
///
/// # Panics
/// When it lacks it, saying how to get it.
pub fn gcs_python() -> PathBuf {
    static CHECKED: OnceLock<PathBuf> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let python = python();
            imports(
                &python,
                "google.cloud.storage",
                "the `google-cloud-storage` package (./scripts/test installs it from scripts/python/pyenv.lock)",
            );
            python
        })
        .clone()
}

/// The single-waiter Cloud Storage lock of the service the GCS store replaces (seed 001), over the
/// official `google-cloud-storage` client against `server`, on object `name` of
/// [`crate::gcs_server::BUCKET`] as `owner`: logs `start`, `end` and `lost` to `log`, prints
/// `waiting`, `acquired`, `release-requested WAITER`, `released`, `lost …` (see
/// `py/gcs_single_waiter_lock.py`, whose flags `args` adds: `--lease`, `--check-every`, `--poll`,
/// `--timeout`, `--work`, `--release-on-request`, `--once`). With `clock_ahead`, its wall clock
/// reads that far ahead (`faketime`, the monotonic clock left alone), as on a machine whose clock
/// is wrong.
pub fn gcs_single_waiter_lock(
    server: &crate::gcs_server::GcsServer,
    name: &str,
    owner: &str,
    log: &EventLog,
    clock_ahead: Option<Duration>,
    args: &[&str],
) -> Proc {
    let mut cmd = match clock_ahead {
        None => Command::new(gcs_python()),
        Some(ahead) => {
            crate::sweep_faketime_leftovers();
            let mut c = Command::new("faketime");
            c.env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .args(["-f", &format!("+{}s", ahead.as_secs())])
                .arg(gcs_python());
            c
        }
    };
    cmd.arg(script("gcs_single_waiter_lock.py"))
        .args(["--emulator", &server.url()])
        .args(["--bucket", crate::gcs_server::BUCKET, "--name", name])
        .args(["--owner", owner])
        .arg("--log")
        .arg(log.path())
        .args(args);
    Proc::spawn(cmd, &format!("the seed's GCS lock as {owner}"))
}
