//! The group guard: a small process in the command's process group that kills that group when
//! `leasehold run` ends — however it ends, SIGKILL included.
//!
//! Without it, a `leasehold run` killed with SIGKILL (or OOM-killed) leaves its command's
//! children running while the lease runs out and another holder starts: two copies of the work
//! under one lock. The direct child dies with leasehold (`PR_SET_PDEATHSIG`), but that reaches
//! no further. The guard is `leasehold` itself, started as `leasehold __guard` with the read end
//! of a pipe as its stdin; leasehold holds the only write end. It is started first, as the leader
//! of a new process group, and the command is then started in that group: there is no moment in
//! which the command runs unguarded (a guard started after the command missed a leasehold killed
//! in between). When leasehold exits, the kernel closes the write end, the guard reads end-of-file
//! and sends SIGKILL to its own process group, which is the command's. Because the guard leads
//! that group, the group id cannot be reused by an unrelated process while the guard runs. The
//! guard ignores the termination signals leasehold sends to the group; only the final SIGKILL
//! ends it.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{ExitCode, Stdio};
use tokio::process::{Child, Command};

/// The hidden first argument that makes `leasehold` a guard.
pub(crate) const ARG: &str = "__guard";

/// The guard's `main`: waits for end-of-file on stdin, then kills its process group.
pub(crate) fn main() -> ExitCode {
    // Returns at end-of-file (leasehold is gone or done); read errors other than EINTR end the
    // wait too: either way the group must not outlive leasehold.
    let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
    // SAFETY: kill(2) with pid 0 targets our own process group, which is the command's; it ends
    // this process too.
    unsafe { libc::kill(0, libc::SIGKILL) };
    ExitCode::FAILURE
}

/// A running guard for the process group `pgid`.
#[derive(Debug)]
pub(crate) struct Guard {
    process: Child,
    /// The write end of the guard's stdin; closing it tells the guard to act.
    pipe: Option<OwnedFd>,
}

impl Guard {
    /// Starts a guard as the leader of a new process group, for a command to be started in it.
    fn lead() -> io::Result<Guard> {
        let (read, write) = pipe(libc::O_CLOEXEC)?;
        // /proc/self/exe: this very binary, even if it was replaced on disk since.
        let mut command = Command::new("/proc/self/exe");
        command
            .arg0("leasehold")
            .arg(ARG)
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: signal(2) is async-signal-safe; called between fork and exec. Ignored
        // dispositions survive exec.
        unsafe {
            command.pre_exec(|| {
                for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let process = command.spawn()?;
        if process.id().is_none() {
            return Err(io::Error::other("the group guard exited at once"));
        }
        Ok(Guard {
            process,
            pipe: Some(write),
        })
    }

    /// Starts a guard and puts `command` (not started yet) in the process group it leads; without
    /// a guard (it cannot start: logged, the command's children may then outlive leasehold), in a
    /// group of its own.
    pub(crate) fn group(command: &mut Command) -> Option<Guard> {
        let guard = Guard::lead()
            .map_err(|e| {
                tracing::warn!(error = %e, "cannot start the process-group guard; the command's children may outlive leasehold");
            })
            .ok();
        let pgid = guard
            .as_ref()
            .and_then(Guard::id)
            .and_then(|p| i32::try_from(p).ok());
        command.process_group(pgid.unwrap_or(0));
        guard
    }

    /// The processes a supervisor waits for itself, not to be reaped as orphans: its `child` and
    /// the child's `guard`.
    pub(crate) fn kept(child: &Child, guard: Option<&Guard>) -> Vec<u32> {
        [child.id(), guard.and_then(Guard::id)]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The guard's pid (`None`: reaped already).
    pub(crate) fn id(&self) -> Option<u32> {
        self.process.id()
    }

    /// Kills what is left of the command's process group (SIGKILL) and waits for the guard to
    /// finish doing so. Call it once the command itself has exited, before the lease is released.
    pub(crate) async fn finish(mut self) {
        drop(self.pipe.take());
        if let Err(e) = self.process.wait().await {
            tracing::warn!(error = %e, "waiting for the process-group guard failed");
        }
    }
}

/// A pipe (read end, write end) with `flags` (`O_CLOEXEC`, `O_NONBLOCK`) on both ends.
pub(crate) fn pipe(flags: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), flags) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two open descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
