//! The task supervisor: the process a queue worker runs each task under, so that whatever the
//! task leaves running ends with the task — before its lease is released and the next task on
//! its key starts — a daemon in a new session (`setsid`) included, and even when the worker is
//! killed with SIGKILL.
//!
//! The worker runs `leasehold __supervise GRACE_MS -- CMD…` (this binary, through
//! `/proc/self/exe`) in a process group of its own. The supervisor makes itself the child
//! subreaper of its descendants ([`crate::process::tree`]) and starts the command in another process
//! group, guarded as `leasehold run` guards its command's ([`crate::process::group_guard`]). A process of the
//! task whose parent exits is re-parented to the supervisor, not to the worker (where it could not
//! be told apart from another task's) nor to init. Once the command has exited, the supervisor
//! kills what is left of its group and, generation by generation, everything else it started
//! ([`tree::sweep`]), and exits as the command did: its exit code, or the same signal.
//!
//! The worker writes the key lease's deadlines on the supervisor's stdin (a pipe), as `run` writes
//! them to its group guard: one CLOCK_MONOTONIC nanosecond count per line, `valid_until` less half
//! the kill margin, moved by each renewal. The supervisor passes each on to the command's group
//! guard, which kills the group when the last one passes: a worker that is paused (SIGSTOP, a
//! freeze) cannot stop the task when the lease runs out, and this dead man's switch does.
//!
//! The worker stops a task by sending the supervisor SIGTERM: the supervisor passes it to the
//! command's group and, once GRACE_MS has passed, kills the group (SIGKILL), then sweeps. When the
//! worker dies, the kernel sends the supervisor SIGTERM too (`PR_SET_PDEATHSIG`); with the worker
//! gone, the supervisor kills the command at once (its lease is no longer renewed) and sweeps. A
//! command that cannot start is reported to the worker on descriptor 3 (a pipe), one line, and the
//! supervisor exits 127.
//!
//! A supervisor itself killed with SIGKILL (the worker's last resort when it overruns the grace
//! by [`OVERRUN`], or the OOM killer) takes the command and its process group with it (the
//! command dies with its parent; the group guard kills the group). What left the group is
//! re-parented to the worker, the subreaper above the supervisor, which kills it before it
//! records the task's end ([`crate::process::tree::sweep_except`]).

use crate::exit::{self, NOT_FOUND};
use crate::process::child::{die_with_parent, stop_signal};
use crate::process::group_guard::Guard;
use crate::process::tree;
use crate::setup;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

/// The hidden first argument that makes `leasehold` a task supervisor.
pub(crate) const ARG: &str = "__supervise";

/// The supervisor's descriptor for telling the worker that the command could not start.
const REPORT_FD: RawFd = 3;

/// How much longer than its grace the worker gives a supervisor that was told to stop before it
/// kills the supervisor (SIGKILL; its group guard then kills the command's group): the
/// supervisor's own sweep, and a margin.
pub(crate) const OVERRUN: Duration = Duration::from_secs(6);

/// The command that runs `argv` under a supervisor that gives it `grace` to exit once told to
/// stop, and the read end of the pipe on which a command that could not start is reported
/// ([`Report::read`]). The write end stays open in this process until the returned [`Report`] is told
/// the supervisor has started ([`Report::started`]).
pub(crate) fn command(argv: &[String], grace: Duration) -> io::Result<(Command, Report)> {
    let (read, write) = crate::process::group_guard::pipe(libc::O_CLOEXEC | libc::O_NONBLOCK)?;
    let raw = write.as_raw_fd();
    // /proc/self/exe: this very binary, even if it was replaced on disk since.
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0("leasehold")
        .arg(ARG)
        .arg(grace.as_millis().to_string())
        .arg("--")
        .args(argv);
    // SAFETY: dup2(2) and fcntl(2) are async-signal-safe; called between fork and exec.
    unsafe {
        command.pre_exec(move || {
            // dup2 leaves the copy open across exec; a descriptor that is already 3 keeps its
            // close-on-exec flag, so that one is cleared.
            let done = if raw == REPORT_FD {
                libc::fcntl(raw, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, REPORT_FD)
            };
            if done == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok((
        command,
        Report {
            read,
            write: Some(write),
        },
    ))
}

/// The worker's end of a supervisor's report pipe.
pub(crate) struct Report {
    read: OwnedFd,
    write: Option<OwnedFd>,
}

impl Report {
    /// Closes this process's write end, once the supervisor has its own copy.
    pub(crate) fn started(&mut self) {
        self.write = None;
    }

    /// What the supervisor reported (the command could not start), once it has exited.
    pub(crate) fn read(self) -> Option<String> {
        let mut bytes = vec![];
        // Non-blocking: what the supervisor wrote before it exited is there already (kept by
        // `read_to_end` even if it then stops on "would block").
        let _ = std::fs::File::from(self.read).read_to_end(&mut bytes);
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    }
}

/// The supervisor's `main`: `__supervise GRACE_MS -- CMD…`.
pub(crate) fn main() -> ExitCode {
    setup::init_logging();
    let args: Vec<OsString> = std::env::args_os().skip(2).collect();
    let (grace, argv) = match args.as_slice() {
        [grace, dashes, argv @ ..] if dashes == "--" && !argv.is_empty() => {
            match grace.to_str().and_then(|g| g.parse::<u64>().ok()) {
                Some(ms) => (Duration::from_millis(ms), argv),
                None => return usage(),
            }
        }
        _ => return usage(),
    };
    let report = report_pipe();
    let Some(runtime) = setup::runtime() else {
        return ExitCode::from(exit::ERROR);
    };
    match runtime.block_on(supervise(grace, argv, report)) {
        Ok(status) => exit_as(status),
        Err(code) => ExitCode::from(code),
    }
}

fn usage() -> ExitCode {
    exit::report("usage: leasehold __supervise GRACE_MS -- CMD [ARGS…] (run by queue workers)");
    ExitCode::from(exit::USAGE)
}

/// Descriptor 3, if the worker passed it, kept from the command.
fn report_pipe() -> Option<std::fs::File> {
    // SAFETY: fcntl(2) on a descriptor number only reads and sets its flags; the descriptor, if
    // open, was left to this process by the worker for this purpose and nothing else owns it.
    unsafe {
        if libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC) == -1 {
            return None;
        }
        Some(std::fs::File::from_raw_fd(REPORT_FD))
    }
}

/// Runs `argv` to its end and sweeps what it left; `Err` is the exit code when it cannot start.
async fn supervise(
    grace: Duration,
    argv: &[OsString],
    report: Option<std::fs::File>,
) -> Result<ExitStatus, u8> {
    // SAFETY: getppid(2) only reads.
    let worker = unsafe { libc::getppid() };
    // The worker's death is a SIGTERM here (not the SIGKILL it asked for), so that the task is
    // still swept; SAFETY: prctl(2) sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) } == -1 {
        tracing::warn!(error = %io::Error::last_os_error(), "cannot watch for the worker's death");
    }
    if let Err(e) = tree::become_subreaper() {
        tracing::warn!(error = %e, "cannot become the task's subreaper; processes that leave its group may outlive it");
    }
    // The termination signals start the grace period instead of ending the supervisor.
    let stops = [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
    ]
    .map(signal);
    let [Ok(mut term), Ok(mut int), Ok(mut hup)] = stops else {
        exit::report("cannot install the supervisor's signal handlers");
        return Err(exit::ERROR);
    };
    let mut orphans = signal(SignalKind::child()).map_err(|e| {
        exit::report(&format!("cannot watch for exited processes: {e}"));
        exit::ERROR
    })?;
    if !worker_alive(worker) {
        // Gone before the handlers were in place: the task does not start.
        return Err(exit::ERROR);
    }
    // The key lease's deadlines, from the worker on stdin; the command's stdin is /dev/null.
    let mut deadlines = deadlines();
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]).stdin(std::process::Stdio::null());
    // The command's process group, led by its guard, ends with the supervisor, however it ends.
    let group_guard = Guard::group(&mut command);
    die_with_parent(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let why = format!("cannot start {:?}: {e}", argv[0]);
            exit::report(&why);
            if let Some(mut r) = report {
                let _ = writeln!(r, "{why}");
            }
            return Err(NOT_FOUND);
        }
    };
    drop(report);
    let keep = Guard::kept(&child, group_guard.as_ref());
    let mut stopping = Stopping {
        grace,
        worker,
        kill_at: None,
        killed: false,
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            Some(()) = term.recv() => stopping.asked(&child),
            Some(()) = int.recv() => stopping.asked(&child),
            Some(()) = hup.recv() => stopping.asked(&child),
            Some(()) = orphans.recv() => tree::reap_orphans(&keep),
            line = next_line(&mut deadlines), if deadlines.is_some() => match line {
                // Passed on to the group guard, which kills the command's group when the last
                // one passes: the worker, paused, could not stop the task itself.
                Some(ns) => {
                    if let (Some(ns), Some(g)) = (ns, &group_guard) {
                        g.deadline_ns(ns);
                    }
                }
                None => deadlines = None,
            },
            () = stopping.due(), if stopping.pending() => {
                tracing::warn!(grace = %humantime::format_duration(grace), "the task did not exit in time; sending SIGKILL");
                stopping.kill(&child);
            }
        }
    };
    if let Some(g) = group_guard {
        g.finish().await;
    }
    tree::sweep(tree::SWEEP_LIMIT).await;
    status.map_err(|e| {
        exit::report(&format!("cannot wait for the task: {e}"));
        exit::ERROR
    })
}

/// The lines of stdin, when the worker passed a pipe there: the key lease's deadlines.
type Deadlines = tokio::io::Lines<tokio::io::BufReader<tokio::net::unix::pipe::Receiver>>;

/// Stdin as the worker's deadlines pipe; `None` when it is not a pipe (nothing to read).
fn deadlines() -> Option<Deadlines> {
    use tokio::io::AsyncBufReadExt;
    // SAFETY: descriptor 0 was left to this process by the worker for this purpose, and is taken
    // over here once (the command gets /dev/null).
    let fd = unsafe { OwnedFd::from_raw_fd(0) };
    let pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok()?;
    Some(tokio::io::BufReader::new(pipe).lines())
}

/// The next deadline line: `Some(Some(ns))`, `Some(None)` for a line that does not parse,
/// `None` at end-of-file or on an error (no more deadlines).
async fn next_line(deadlines: &mut Option<Deadlines>) -> Option<Option<u64>> {
    let lines = deadlines.as_mut()?;
    match lines.next_line().await {
        Ok(Some(line)) => Some(line.trim().parse().ok()),
        Ok(None) | Err(_) => None,
    }
}

/// Whether `worker` is still this process's parent.
fn worker_alive(worker: libc::pid_t) -> bool {
    // SAFETY: getppid(2) only reads.
    let parent = unsafe { libc::getppid() };
    parent == worker
}

/// How the command is being stopped.
struct Stopping {
    grace: Duration,
    /// The worker's pid: a termination signal after it is gone means it died.
    worker: libc::pid_t,
    /// When the command gets SIGKILL, once asked to stop.
    kill_at: Option<Instant>,
    killed: bool,
}

impl Stopping {
    /// A termination signal: the worker stops the task (SIGTERM to the command's group, SIGKILL
    /// after the grace), or the worker died (SIGKILL at once: its lease is no longer renewed).
    fn asked(&mut self, child: &tokio::process::Child) {
        if !worker_alive(self.worker) {
            tracing::warn!("the worker is gone; killing the task");
            return self.kill(child);
        }
        if self.kill_at.is_none() {
            stop_signal(child, libc::SIGTERM);
            self.kill_at = Some(Instant::now() + self.grace);
        }
    }

    fn kill(&mut self, child: &tokio::process::Child) {
        if !self.killed {
            self.killed = true;
            stop_signal(child, libc::SIGKILL);
        }
    }

    /// Whether a SIGKILL is due later.
    fn pending(&self) -> bool {
        self.kill_at.is_some() && !self.killed
    }

    /// Until the SIGKILL is due.
    async fn due(&self) {
        if let Some(at) = self.kill_at {
            tokio::time::sleep_until(at).await;
        }
    }
}

/// Exits as `status` says the command did: with its code, or killed by its signal.
fn exit_as(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(exit::ERROR));
    }
    let sig = status.signal().unwrap_or(libc::SIGKILL);
    // SAFETY: setrlimit(2), signal(2) and raise(3) act on this process only. No core file: the
    // command's, if any, was written already.
    unsafe {
        let mut core: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_CORE, &mut core) == 0 {
            core.rlim_cur = 0;
            libc::setrlimit(libc::RLIMIT_CORE, &core);
        }
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    // A signal whose default is to be ignored, or one that could not be raised.
    ExitCode::from(exit::SIGNAL_BASE.saturating_add(u8::try_from(sig).unwrap_or(0)))
}
