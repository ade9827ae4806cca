//! A command run while a lease is held (`run`, and `elect` with a command).
//!
//! When leasehold's stdin is not a terminal (services, cron, CI) the child runs in a process group
//! of its own (led by its group guard, started just before it), and termination signals
//! (forwarded ones, SIGTERM on a lost lease, SIGKILL after the grace period) go to that whole
//! group, so a shell script's children stop with it. On a terminal the child stays in leasehold's
//! group, so interactive commands keep the terminal (and a Ctrl-C, which the terminal sends to
//! that whole group, is not forwarded a second time). The `--on-handoff` signal goes to the child
//! alone ([`crate::child`] sends them). The command dies with leasehold (`PR_SET_PDEATHSIG`), and
//! its process group with it ([`crate::guard`]). When the command ends, whatever it left running
//! — in its group or not (`setsid`), on a terminal too — is killed before the lease is released
//! ([`crate::tree`]).

use crate::child::{die_with_parent, signal_child, signal_status, stop_signal};
use crate::exit::{self, Failure, CANNOT_EXECUTE, ERROR, NOT_FOUND};
use crate::guard::Guard;
use crate::holding::{release_failed, Ended};
use crate::signals::{self, Forwarded, Received, SignalArg};
use crate::tree;
use leasehold::{Key, LeaseGuard, Locks, LostReason, Released};
use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How supervision of the child ended.
enum End {
    /// The child exited by itself.
    Exited(io::Result<ExitStatus>),
    /// leasehold got SIGTERM, SIGINT or SIGHUP.
    Signalled(Received),
    /// The lease was lost.
    Lost(LostReason),
}

/// A command to run under a lease.
pub(crate) struct Supervised<'a> {
    pub(crate) program: &'a OsString,
    pub(crate) args: &'a [OsString],
    /// How long it may take to exit after SIGTERM before SIGKILL.
    pub(crate) grace: Duration,
    /// The signal it gets (once) when someone waits for the lease.
    pub(crate) on_handoff: Option<SignalArg>,
}

/// Runs `command` while `guard` holds the lease on `key`: signals forwarded, the handoff signal
/// sent, the command stopped (SIGTERM, SIGKILL after the grace period) when the lease is lost,
/// and whatever it left running killed ([`crate::tree`]) before the lease is released.
pub(crate) async fn supervise(
    locks: &Locks,
    guard: &LeaseGuard,
    key: &Key,
    command: &Supervised<'_>,
    signals: &mut Forwarded,
) -> Result<Ended, Failure> {
    let program = command.program;
    let mut child_command = Command::new(program);
    child_command
        .args(command.args)
        .env("LEASEHOLD_KEY", key.as_str())
        .env("LEASEHOLD_FENCE", guard.fence().to_string())
        .env("LEASEHOLD_HOLDER", locks.holder().as_str());
    // SAFETY: isatty(3) only inspects the descriptor.
    let own_group = unsafe { libc::isatty(0) } == 0;
    // Nor do the command's own children: the guard, started first as the leader of the group the
    // command joins, kills the group once leasehold ends, however it ends.
    let group_guard = if own_group {
        Guard::group(&mut child_command)
    } else {
        None
    };
    // The command never outlives leasehold: a leasehold that is killed cannot release, and the
    // lease's expiry would let another holder start next to it.
    die_with_parent(&mut child_command);
    // Nor does anything it starts outlive the run, wherever it goes ([`crate::tree`]).
    if let Err(e) = tree::become_subreaper() {
        tracing::warn!(error = %e, "cannot become the command's subreaper; processes that leave its group may outlive the run");
    }
    let mut orphans = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        .map_err(|e| Failure::error(format!("cannot watch for exited processes: {e}")))?;
    let mut child = match child_command.spawn() {
        Ok(child) => child,
        Err(e) => {
            release(guard, key).await;
            let code = if e.kind() == io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_EXECUTE
            };
            return Err(Failure::new(
                code,
                format!("cannot run {:?}: {e}", program.to_string_lossy()),
            ));
        }
    };

    let keep = Guard::kept(&child, group_guard.as_ref());
    let mut on_handoff = command.on_handoff;
    let end = loop {
        tokio::select! {
            biased;
            reason = guard.lost() => break End::Lost(reason),
            status = child.wait() => break End::Exited(status),
            sig = signals.recv() => break End::Signalled(sig),
            Some(()) = orphans.recv() => tree::reap_orphans(&keep),
            waiter = guard.handoff_requested(), if on_handoff.is_some() => {
                if let Some(sig) = on_handoff.take() {
                    tracing::info!(key = %key, waiter, signal = %sig, "a waiter wants the lease; signalling the command");
                    signal_child(&child, sig.0);
                }
            }
        }
    };

    // Whatever the command left running, in its group or not, ends before the lease does.
    let finish_group = || async {
        if let Some(g) = group_guard {
            g.finish().await;
        }
        tree::sweep(tree::SWEEP_LIMIT).await;
    };
    let grace = command.grace;
    match end {
        End::Exited(status) => {
            finish_group().await;
            release(guard, key).await;
            exit_status(status).map(Ended::Status)
        }
        End::Signalled(sig) => {
            forward(&child, sig);
            let status = wait_within(&mut child, grace, signals).await;
            finish_group().await;
            release(guard, key).await;
            exit_status(status).map(Ended::Status)
        }
        End::Lost(reason) => {
            exit::report(&format!(
                "lease on {:?} lost: {reason}; stopping the command (SIGTERM, SIGKILL after {})",
                key.as_str(),
                humantime::format_duration(grace)
            ));
            stop_signal(&child, libc::SIGTERM);
            if let Err(e) = wait_within(&mut child, grace, signals).await {
                tracing::warn!(error = %e, "waiting for the command failed");
            }
            finish_group().await;
            // Not ours any more; this only stops the guard (the store answers "not held").
            let _ = guard.release().await;
            Ok(Ended::Lost(reason))
        }
    }
}

/// Passes a signal leasehold received on to the child (see [`stop_signal`]) — unless the terminal
/// sent it (Ctrl-C, hang-up) to a process group the child shares with leasehold: the child got
/// that one already, and a second SIGINT would end a command that handles the first (a REPL, a
/// graceful shutdown) at once.
fn forward(child: &Child, sig: Received) {
    let Some(pid) = child.id() else { return };
    // SAFETY: getpgrp(2) only reads.
    let shares_group = signals::group_of(pid) == Some(unsafe { libc::getpgrp() });
    if sig.from_kernel && shares_group {
        tracing::info!(pid, signal = %signals::name(sig.signal), "the terminal signalled the command too; not forwarding");
        return;
    }
    stop_signal(child, sig.signal);
}

/// Waits for the child to exit, forwarding further signals, and kills it with SIGKILL once
/// `grace` has passed.
async fn wait_within(
    child: &mut Child,
    grace: Duration,
    signals: &mut Forwarded,
) -> io::Result<ExitStatus> {
    let deadline = Instant::now() + grace;
    loop {
        tokio::select! {
            biased;
            status = child.wait() => return status,
            sig = signals.recv() => forward(child, sig),
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!(grace = %humantime::format_duration(grace), "the command did not exit in time; sending SIGKILL");
                stop_signal(child, libc::SIGKILL);
                return child.wait().await;
            }
        }
    }
}

/// Releases the lease after the command has finished, telling the user if it was lost.
async fn release(guard: &LeaseGuard, key: &Key) {
    match guard.release().await {
        Ok(Released::Released | Released::AlreadyReleased) => {}
        Ok(Released::Lost(reason)) => exit::report(&format!(
            "the lease on {:?} was no longer held when the command finished: {reason}",
            key.as_str()
        )),
        Err(e) => release_failed(key, &e),
    }
}

/// leasehold's exit status for the child's: its code, or 128+S if signal S ended it.
fn exit_status(status: io::Result<ExitStatus>) -> Result<u8, Failure> {
    let status = status.map_err(|e| Failure::error(format!("cannot wait for the command: {e}")))?;
    if let Some(code) = status.code() {
        return Ok(u8::try_from(code & 0xff).unwrap_or(ERROR));
    }
    Ok(status.signal().map_or(ERROR, signal_status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_follow_the_shell() {
        assert_eq!(exit_status(Ok(ExitStatus::from_raw(7 << 8))), Ok(7));
        assert_eq!(
            exit_status(Ok(ExitStatus::from_raw(libc::SIGKILL))),
            Ok(137)
        );
        assert_eq!(signal_status(libc::SIGTERM), 143);
    }
}
