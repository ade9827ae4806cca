//! The task supervisor: the process a queue worker runs each task under, so that whatever the
//! task leaves running ends with the task — before its lease is released and the next task on
//! its key starts — a daemon in a new session (`setsid`) included.
//!
//! The worker runs `leasehold __supervise GRACE_MS -- CMD…` (this binary, through
//! `/proc/self/exe`) as the leader of the task's process group. The supervisor makes itself the
//! child subreaper of its descendants ([`crate::tree`]) and starts the command in that group.
//! A process of the task whose parent exits is re-parented to the supervisor, not to the worker
//! (where it could not be told apart from another task's) nor to init. Once the command has
//! exited, the supervisor kills what is left, generation by generation ([`tree::sweep`]), and
//! exits as the command did: its exit code, or the same signal.
//!
//! The worker stops a task by signalling its process group (SIGTERM): the command gets the
//! signal, and the supervisor, which gets it too, waits up to GRACE_MS for the command to exit
//! before it kills it (SIGKILL), then sweeps. A command that cannot start is reported to the
//! worker on descriptor 3 (a pipe), one line, and the supervisor exits 127.
//!
//! Limit: a worker killed with SIGKILL kills the task's process group (its group guard) and the
//! supervisor with it; what left the group by then is not swept, as with `leasehold run`.

use crate::exit::{self, NOT_FOUND};
use crate::run::die_with_parent;
use crate::tree;
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
/// kills the task's process group itself: the supervisor's own sweep, and a margin.
pub(crate) const OVERRUN: Duration = Duration::from_secs(6);

/// The command that runs `argv` under a supervisor that gives it `grace` to exit once told to
/// stop, and the read end of the pipe on which a command that could not start is reported
/// ([`report`]). The write end stays open in this process until the returned [`Report`] is told
/// the supervisor has started ([`Report::started`]).
pub(crate) fn command(argv: &[String], grace: Duration) -> io::Result<(Command, Report)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two open descriptors that nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
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
    crate::app::init_logging();
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
    let Some(runtime) = crate::app::runtime() else {
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
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
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
    let keep: Vec<u32> = child.id().into_iter().collect();
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            Some(()) = term.recv() => kill_at = kill_at.or(Some(Instant::now() + grace)),
            Some(()) = int.recv() => kill_at = kill_at.or(Some(Instant::now() + grace)),
            Some(()) = hup.recv() => kill_at = kill_at.or(Some(Instant::now() + grace)),
            Some(()) = orphans.recv() => tree::reap_orphans(&keep),
            () = async { if let Some(at) = kill_at { tokio::time::sleep_until(at).await } }, if kill_at.is_some() && !killed => {
                tracing::warn!(grace = %humantime::format_duration(grace), "the task did not exit in time; sending SIGKILL");
                killed = true;
                let _ = child.start_kill();
            }
        }
    };
    tree::sweep(tree::SWEEP_LIMIT).await;
    status.map_err(|e| {
        exit::report(&format!("cannot wait for the task: {e}"));
        exit::ERROR
    })
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
