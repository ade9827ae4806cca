//! Signal names, sending signals to the child, and the signals leasehold forwards.

use std::fmt;
use std::io;

/// Signal names without the `SIG` prefix, and their numbers on this platform.
const NAMES: &[(&str, libc::c_int)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("SYS", libc::SIGSYS),
];

/// The highest signal number accepted as a number (Linux's SIGRTMAX).
const MAX_SIGNAL: libc::c_int = 64;

/// A signal given on the command line: `SIGUSR1`, `USR1`, `usr1` or `10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SignalArg(pub(crate) libc::c_int);

impl SignalArg {
    /// Parses a signal name or number.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Ok(n) = t.parse::<libc::c_int>() {
            return if (1..=MAX_SIGNAL).contains(&n) {
                Ok(SignalArg(n))
            } else {
                Err(format!("signal number {n} is out of range 1-{MAX_SIGNAL}"))
            };
        }
        let upper = t.to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        NAMES
            .iter()
            .find(|(name, _)| *name == bare)
            .map(|&(_, n)| SignalArg(n))
            .ok_or_else(|| {
                format!("unknown signal {s:?} (use a name like SIGUSR1, USR1, TERM, or a number)")
            })
    }
}

impl fmt::Display for SignalArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&name(self.0))
    }
}

/// `SIGTERM` for 15, `signal 40` for numbers without a name.
pub(crate) fn name(sig: libc::c_int) -> String {
    NAMES
        .iter()
        .find(|&&(_, n)| n == sig)
        .map_or_else(|| format!("signal {sig}"), |(name, _)| format!("SIG{name}"))
}

/// Sends `sig` to the process `pid`; a process that is already gone is not an error.
pub(crate) fn send(pid: u32, sig: libc::c_int) -> io::Result<()> {
    kill(pid, false, sig)
}

/// Sends `sig` to the process group `pgid` (led by a child of ours: a command or its group
/// guard); a group that is
/// already gone is not an error.
pub(crate) fn send_group(pgid: u32, sig: libc::c_int) -> io::Result<()> {
    kill(pgid, true, sig)
}

/// `id` as a pid or process-group id to signal: never 0, 1 (init) or anything that turns negative
/// (which kill(2) would read as "every process" or a group).
pub(crate) fn pid(id: u32) -> io::Result<libc::pid_t> {
    libc::pid_t::try_from(id)
        .ok()
        .filter(|p| *p > 1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))
}

/// The process group of our unreaped child `pid` (`None` if it cannot be read).
pub(crate) fn group_of(pid: u32) -> Option<libc::pid_t> {
    let p = self::pid(pid).ok()?;
    // SAFETY: getpgid(2) only reads; `p` is our unreaped child, so it names no other process.
    let g = unsafe { libc::getpgid(p) };
    (g > 0).then_some(g)
}

fn kill(id: u32, group: bool, sig: libc::c_int) -> io::Result<()> {
    let id = pid(id)?;
    // SAFETY: kill(2) has no memory-safety preconditions. `id` is our own unreaped child's pid
    // (> 1), or the group such a child leads: it cannot name a recycled pid, and a group target is never
    // -1 ("every process").
    if unsafe { libc::kill(if group { -id } else { id }, sig) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(e)
    }
}

/// A termination signal leasehold received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    /// The signal number.
    pub(crate) signal: libc::c_int,
    /// Sent by the kernel rather than by a process: on Linux, a terminal's Ctrl-C (SIGINT) and
    /// hang-up (SIGHUP), which the terminal sends to its whole foreground process group — so a
    /// child in leasehold's group got it too and must not get it a second time.
    pub(crate) from_kernel: bool,
}

/// The termination signals leasehold catches and forwards: SIGTERM, SIGINT, SIGHUP, with where
/// each came from (read from `siginfo` by a thread of its own).
#[derive(Debug)]
pub(crate) struct Forwarded {
    rx: tokio::sync::mpsc::UnboundedReceiver<Received>,
    handle: signal_hook::iterator::Handle,
}

impl Forwarded {
    /// Installs the handlers (from here on these signals no longer end leasehold by themselves).
    pub(crate) fn install() -> io::Result<Self> {
        use signal_hook::iterator::exfiltrator::origin::WithOrigin;
        use signal_hook::low_level::siginfo::Cause;
        let mut signals = signal_hook::iterator::SignalsInfo::<WithOrigin>::new([
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
        ])?;
        let handle = signals.handle();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("leasehold-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let received = Received {
                        signal: origin.signal,
                        from_kernel: origin.cause == Cause::Kernel,
                    };
                    if tx.send(received).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Forwarded { rx, handle })
    }

    /// The next signal received. Cancel safe.
    pub(crate) async fn recv(&mut self) -> Received {
        match self.rx.recv().await {
            Some(received) => received,
            // The thread is gone (it only ends after `close`): no more signals.
            None => std::future::pending().await,
        }
    }
}

impl Drop for Forwarded {
    fn drop(&mut self) {
        self.handle.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_and_number() {
        for s in ["SIGUSR1", "USR1", "usr1", "SigUsr1", " USR1 "] {
            assert_eq!(SignalArg::parse(s), Ok(SignalArg(libc::SIGUSR1)), "{s}");
        }
        assert_eq!(SignalArg::parse("TERM"), Ok(SignalArg(libc::SIGTERM)));
        assert_eq!(SignalArg::parse("15"), Ok(SignalArg(15)));
        assert!(SignalArg::parse("0").is_err());
        assert!(SignalArg::parse("65").is_err());
        assert!(SignalArg::parse("BOGUS").is_err());
        assert!(SignalArg::parse("").is_err());
        assert_eq!(name(libc::SIGUSR1), "SIGUSR1");
        assert_eq!(name(40), "signal 40");
    }
}
