//! What every launcher shares: the servers' directories, free ports, starting a process that dies
//! with this one, and waiting for it to come up.

use crate::error::{Error, Result};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The file in a [`server_dir`] naming the process that made it.
const OWNER: &str = "owner.pid";

/// A directory under /tmp for a server's files, named `leasehold-<kind>-…`, with [`OWNER`]
/// naming this process. A shared server lives in a static that is never dropped, so its directory
/// outlives the process (the server itself dies with it, by `PR_SET_PDEATHSIG`) — etcd's and
/// PostgreSQL's hold ≈ 125–140 MB each; the first call in a process removes the directories of
/// processes that are gone.
pub(crate) fn server_dir(kind: &str) -> Result<tempfile::TempDir> {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_stale_dirs);
    let dir = tempfile::Builder::new()
        .prefix(&format!("leasehold-{kind}-"))
        .tempdir_in("/tmp")
        .map_err(Error::io(format!("a directory under /tmp for {kind}")))?;
    std::fs::write(dir.path().join(OWNER), std::process::id().to_string())
        .map_err(Error::io(format!("write {OWNER}")))?;
    Ok(dir)
}

/// Removes the [`server_dir`]s that earlier processes left under /tmp: one older than a
/// minute whose owner (its [`OWNER`] file, or for older PostgreSQL directories the server's
/// `postmaster.pid`) is no live process.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let ours = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("leasehold-"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60));
        if !ours || !old {
            continue;
        }
        let pid = |file: PathBuf| -> Option<i32> {
            let text = std::fs::read_to_string(file).ok()?;
            text.lines().next()?.trim().parse().ok()
        };
        let Some(owner) = pid(path.join(OWNER)).or_else(|| pid(path.join("data/postmaster.pid")))
        else {
            continue;
        };
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        let alive = owner > 0 && unsafe { libc::kill(owner, 0) } == 0;
        if !alive {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Checks `ready` every `every` until it holds; an [`Error::Setup`] with `failure()` once `limit`
/// has passed.
pub(crate) fn poll_until(
    limit: Duration,
    every: Duration,
    mut ready: impl FnMut() -> bool,
    failure: impl Fn() -> String,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    while !ready() {
        if Instant::now() >= deadline {
            return Err(Error::Setup(failure()));
        }
        std::thread::sleep(every);
    }
    Ok(())
}

/// Runs `start` until it gives a server, three times at most (a start fails when another process
/// took a port between [`free_port`] and the server's bind); each failure is logged on stderr.
/// Only [`Error::NotStarted`] is tried again: a missing program or a failed setup step is returned
/// at once.
///
/// # Errors
/// When all three fail, an [`Error::NotStarted`] with each failure.
pub(crate) fn in_three_starts<T>(what: &str, mut start: impl FnMut() -> Result<T>) -> Result<T> {
    let mut failures = Vec::new();
    for _ in 0..3 {
        match start() {
            Ok(server) => return Ok(server),
            Err(Error::NotStarted(why)) => {
                eprintln!("{what} did not start: {why}");
                failures.push(why);
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::NotStarted(format!(
        "{what} did not start in 3 attempts:\n{}",
        failures.join("\n")
    )))
}

/// Waits until `ready` holds for a server that `child` runs, checking every `every` for at most
/// `limit`; an error names `what` and says whether the process exited or ran out of time, and the
/// process is then killed and reaped.
pub(crate) fn wait_up(
    child: &mut Child,
    what: &str,
    limit: Duration,
    every: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{what} exited ({status})"));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not come up within {limit:?}"));
        }
        std::thread::sleep(every);
    }
}

/// `why` a server did not start, with its log file `log` (empty if there is none).
pub(crate) fn with_log(why: &str, log: &Path) -> String {
    format!(
        "{why}; its log:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    )
}

/// `why` a server did not start, with the last 8 lines of its log file `log`.
pub(crate) fn with_log_tail(why: &str, log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(8)..].join("\n");
    format!("{why}; its log ends:\n{tail}")
}

/// A connection to `127.0.0.1:port`, unless nothing listens there — or the connection is to
/// itself. Probing a port in the ephemeral range before its server binds it can pick that very
/// port as the local end, and TCP's simultaneous open then connects the socket to itself: it holds
/// the port, so the server starting there fails to bind ("address already in use").
pub(crate) fn connect_loopback(port: u16) -> Option<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    (s.local_addr().ok()? != s.peer_addr().ok()?).then_some(s)
}

/// A free loopback port (bound and released; the server binds it right after).
///
/// # Errors
/// When no loopback port can be bound.
pub fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(Error::io("bind a free loopback port"))
}

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from the launcher thread, which lives as long as the process: with
/// `PR_SET_PDEATHSIG` the child is killed when this process dies.
pub(crate) fn spawn(mut cmd: Command) -> std::io::Result<Child> {
    static LAUNCHER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let tx = LAUNCHER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                use std::os::unix::process::CommandExt;
                // SAFETY: prctl is async-signal-safe; called between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                let _ = reply.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    cmd.stdin(Stdio::null());
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .map_err(std::io::Error::other)?;
    reply_rx.recv().map_err(std::io::Error::other)?
}

/// Kills `child` (SIGKILL) and reaps it, if there is one.
pub(crate) fn kill(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Sends `sig` to the process `pid` (a server started here, not yet reaped, or one of its own
/// children).
pub(crate) fn signal(pid: Option<u32>, sig: i32) {
    if let Some(pid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: kill(2) on a server's process, which its launcher has not reaped.
        unsafe { libc::kill(pid, sig) };
    }
}

/// A server process that can hang (SIGSTOP) with its connections open, and go on (SIGCONT): a
/// server that stops answering while its clients' connections stay up, as a hung process or a
/// partition that neither side sees.
pub trait Pausable {
    /// The PID of the process to pause (an emulator's, not its proxy's), while it runs.
    fn process(&self) -> Option<u32>;

    /// Hangs it (SIGSTOP): its connections stay open and silent until [`Pausable::resume`].
    fn pause(&self) {
        signal(self.process(), libc::SIGSTOP);
    }

    /// Continues it after [`Pausable::pause`] (SIGCONT).
    fn resume(&self) {
        signal(self.process(), libc::SIGCONT);
    }
}

/// Removes the shared-memory objects libfaketime left behind for processes that are gone
/// (`/dev/shm/faketime_shm_PID`, `/dev/shm/sem.faketime_sem_PID`). A process under libfaketime
/// killed with SIGKILL never removes its own, and a later process given the same PID then fails
/// to start its clock ("shm_open failed: File exists"): on a machine that has run many such
/// processes, a good part of all PIDs.
pub fn sweep_faketime_leftovers() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let pid = name
            .strip_prefix("faketime_shm_")
            .or_else(|| name.strip_prefix("sem.faketime_sem_"))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
