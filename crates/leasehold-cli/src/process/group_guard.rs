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
//!
//! The guard is also a dead man's switch for the lease. A leasehold that is paused (SIGSTOP, a
//! cgroup freeze, a debugger, starvation) cannot stop its command when the lease runs out, and
//! the pipe stays open. So leasehold writes each deadline by which the command must be gone — a
//! little before the lease's `valid_until`, moved by every renewal — on the pipe, one line each:
//! an absolute CLOCK_MONOTONIC time in nanoseconds, which every process of the host reads alike.
//! The guard kills the group when the last deadline it was told passes, as it does at
//! end-of-file.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{ExitCode, Stdio};
use tokio::process::{Child, Command};

/// The hidden first argument that makes `leasehold` a guard.
pub(crate) const ARG: &str = "__guard";

/// The guard's `main`: waits for end-of-file on stdin or the last deadline read from it,
/// whichever comes first, then kills its process group.
pub(crate) fn main() -> ExitCode {
    wait_for_end_or_deadline();
    // SAFETY: kill(2) with pid 0 targets our own process group, which is the command's; it ends
    // this process too.
    unsafe { libc::kill(0, libc::SIGKILL) };
    ExitCode::FAILURE
}

/// Reads deadlines (one CLOCK_MONOTONIC nanosecond count per line) from stdin until end-of-file,
/// a read error, or the last deadline read has passed.
fn wait_for_end_or_deadline() {
    let mut deadline: Option<u64> = None;
    let mut line = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let timeout = match deadline {
            None => -1,
            Some(d) => {
                let now = monotonic_ns();
                if now >= d {
                    return;
                }
                // Rounded up, so that the deadline has passed when poll returns.
                i32::try_from((d - now).div_ceil(1_000_000)).unwrap_or(i32::MAX)
            }
        };
        let mut fd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd we own.
        let ready = unsafe { libc::poll(&mut fd, 1, timeout) };
        if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
        if ready <= 0 {
            continue;
        }
        // SAFETY: read(2) into a buffer we own, of its length.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            return;
        }
        let Ok(n) = usize::try_from(n) else {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        };
        for &b in &buf[..n] {
            if b != b'\n' {
                line.push(b);
                continue;
            }
            // A line that does not parse changes nothing (leasehold writes none).
            if let Some(d) = std::str::from_utf8(&line).ok().and_then(|l| l.parse().ok()) {
                deadline = Some(d);
            }
            line.clear();
        }
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds: the same clock in every process of the host.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `at` as an absolute CLOCK_MONOTONIC time in nanoseconds (measured against now, so it does not
/// depend on which clock `Instant` reads).
pub(crate) fn monotonic_at(at: tokio::time::Instant) -> u64 {
    let (now, now_ns) = (tokio::time::Instant::now(), monotonic_ns());
    if at >= now {
        let ahead = u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX);
        now_ns.saturating_add(ahead)
    } else {
        let behind = u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX);
        now_ns.saturating_sub(behind)
    }
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

    /// Tells the guard to kill the command's group at `at` unless told of a later time first (it
    /// is told every renewal's deadline). A guard that cannot be told is already killing it.
    pub(crate) fn deadline(&self, at: tokio::time::Instant) {
        self.deadline_ns(monotonic_at(at));
    }

    /// [`deadline`](Self::deadline) as an absolute CLOCK_MONOTONIC time in nanoseconds.
    pub(crate) fn deadline_ns(&self, ns: u64) {
        let Some(pipe) = &self.pipe else { return };
        if let Err(e) = write_deadline(pipe, ns) {
            tracing::warn!(error = %e, "cannot tell the process-group guard the lease's deadline");
        }
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

/// Writes the deadline `ns` (CLOCK_MONOTONIC nanoseconds) on `pipe` as one line, as a guard or a
/// task supervisor reads them.
pub(crate) fn write_deadline(pipe: &OwnedFd, ns: u64) -> io::Result<()> {
    let line = format!("{ns}\n");
    // One short write to a pipe is atomic and the reader is always reading it.
    // SAFETY: write(2) of a buffer we own, on the descriptor we own.
    let n = unsafe { libc::write(pipe.as_raw_fd(), line.as_ptr().cast(), line.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
