//! A command run while a lease is held (`run`, and `elect` with a command).
//!
//! When leasehold's stdin is not a terminal (services, cron, CI) the child runs in a process group
//! of its own (led by its group guard, started just before it), and termination signals
//! (forwarded ones, SIGTERM on a lost lease, SIGKILL after the grace period) go to that whole
//! group, so a shell script's children stop with it. The two graces are named apart: the shutdown
//! grace (`--grace`) follows a forwarded signal while the lease is healthy and renewed, and the
//! loss grace (`--loss-grace`, [`crate::process::loss`]) follows the stop-by deadline of a lease whose
//! renewals fail, bounded by the time left on it. On a terminal the child stays in leasehold's
//! group, so interactive commands keep the terminal (and a Ctrl-C, which the terminal sends to
//! that whole group, is not forwarded a second time). The `--on-handoff` signal goes to the child
//! alone ([`crate::process::child`] sends them). The command dies with leasehold (`PR_SET_PDEATHSIG`), and
//! its process group with it ([`crate::process::group_guard`]). When the command ends, whatever it left running
//! — in its group or not (`setsid`), on a terminal too — is killed before the lease is released
//! ([`crate::process::tree`]).

use crate::exit::{self, Failure, CANNOT_EXECUTE, ERROR, NOT_FOUND};
use crate::lease::{release_failed, Ended};
use crate::output;
use crate::process::child::{
    die_with_parent, signal_child, signal_status, sleep_until, stop_signal,
};
use crate::process::group_guard::Guard;
use crate::process::loss::Loss;
use crate::process::signals::{self, Forwarded, Received, SignalArg};
use crate::process::tree;
use leasehold::{Key, LeaseGuard, Locks, Released, StopReason};
use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// A command to run under a lease.
pub(crate) struct Supervised<'a> {
    pub(crate) program: &'a OsString,
    pub(crate) args: &'a [OsString],
    /// The shutdown grace: how long it may take to exit after a forwarded SIGTERM (the lease
    /// healthy and renewed meanwhile) before SIGKILL.
    pub(crate) grace: Duration,
    /// How it is stopped when the lease is failing or gone.
    pub(crate) loss: Loss,
    /// The signal it gets (once) when someone waits for the lease.
    pub(crate) on_handoff: Option<SignalArg>,
}

/// Runs `command` while `guard` holds the lease on `key`: signals forwarded (SIGKILL after the
/// shutdown grace), the handoff signal sent, the command stopped before the lease could expire
/// when renewals fail (SIGTERM at the stop-by deadline, SIGKILL the kill margin before
/// `valid_until`) and at once when the store says the lease is gone (after `--overlap-grace` if
/// given), and whatever it left running killed ([`crate::process::tree`]) before the lease is released.
/// Its group guard is told each renewal's deadline ([`crate::process::group_guard`]), so a leasehold that is
/// paused does not leave it running past the lease either.
pub(crate) async fn supervise(
    locks: &Locks,
    guard: &LeaseGuard,
    key: &Key,
    command: &Supervised<'_>,
    signals: &mut Forwarded,
) -> Result<Ended, Failure> {
    let program = command.program;
    let loss = command.loss;
    let mut known = guard.valid_until();
    let mut child_command = Command::new(program);
    child_command
        .args(command.args)
        .env("LEASEHOLD_KEY", key.as_str())
        .env("LEASEHOLD_FENCE", guard.fence().to_string())
        .env("LEASEHOLD_HOLDER", locks.holder().as_str())
        .env(
            "LEASEHOLD_DEADLINE",
            crate::process::group_guard::monotonic_at(loss.watchdog(known)).to_string(),
        );
    // SAFETY: isatty(3) only inspects the descriptor.
    let own_group = unsafe { libc::isatty(0) } == 0;
    // Nor do the command's own children: the guard, started first as the leader of the group the
    // command joins, kills the group once leasehold ends, however it ends, or once the lease's
    // deadline passes without a renewal.
    let group_guard = if own_group {
        Guard::group(&mut child_command)
    } else {
        None
    };
    if let Some(g) = &group_guard {
        g.deadline(loss.watchdog(known));
    }
    // The command never outlives leasehold: a leasehold that is killed cannot release, and the
    // lease's expiry would let another holder start next to it.
    die_with_parent(&mut child_command);
    // Nor does anything it starts outlive the run, wherever it goes ([`crate::process::tree`]).
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
    // Why the command is being stopped for the lease, and when it gets SIGKILL.
    let mut stopped: Option<StopReason> = None;
    let mut kill_at: Option<Instant> = None;
    // SIGKILL was due at once (no SIGTERM, no grace): already said, and no grace ran out.
    let mut kill_now = false;
    let mut killed = false;
    let status = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status,
            why = guard.must_stop(), if stopped.is_none() => {
                (kill_at, kill_now) = stop_for_lease(&child, key, &why, loss.kill_at(&why, guard.valid_until()), kill_at);
                stopped = Some(why);
            }
            // Told to stop while renewals failed, then lost: the store may say it is gone.
            reason = guard.lost(), if matches!(stopped, Some(StopReason::RenewalsFailing { .. })) => {
                let why = StopReason::Lost(reason);
                (kill_at, kill_now) = stop_for_lease(&child, key, &why, loss.kill_at(&why, guard.valid_until()), kill_at);
                stopped = Some(why);
            }
            () = sleep_until(kill_at), if kill_at.is_some() && !killed => {
                if !kill_now {
                    tracing::warn!("the command did not exit in time; sending SIGKILL");
                }
                stop_signal(&child, libc::SIGKILL);
                killed = true;
            }
            Some(v) = guard.valid_until_changed(known) => {
                known = v;
                if let Some(g) = &group_guard {
                    g.deadline(loss.watchdog(v));
                }
            }
            sig = signals.recv() => {
                forward(&child, sig);
                if kill_at.is_none() {
                    kill_at = Some(Instant::now() + command.grace);
                }
            }
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
    if let Some(g) = group_guard {
        g.finish().await;
    }
    tree::sweep(tree::SWEEP_LIMIT).await;
    // The command outlived the lease's validity: leasehold was paused (SIGSTOP, a freeze) and
    // the group guard killed the command at the deadline. Not the command's own status.
    if stopped.is_none() && !guard.is_current() {
        let why = StopReason::RenewalsFailing {
            valid_until: guard.valid_until(),
        };
        exit::report(&format!(
            "lease on {:?} ran out while leasehold could not act (paused?); the command was killed at its deadline",
            key.as_str()
        ));
        stopped = Some(why);
    }
    match stopped {
        None => {
            release(guard, key).await;
            exit_status(status).map(Ended::Status)
        }
        Some(why) => {
            if let Err(e) = status {
                tracing::warn!(error = %e, "waiting for the command failed");
            }
            // Lost, or about to be: this frees it if it is still ours, or only stops the guard.
            let _ = guard.release().await;
            Ok(Ended::Lost(why))
        }
    }
}

/// Tells why the command is stopped for its lease (`why`) and starts stopping it: SIGTERM when
/// SIGKILL is due later (`at`); the time SIGKILL is due, the earlier of `at` and `kill_at`, and
/// whether that is now (said so: no SIGTERM, no grace).
fn stop_for_lease(
    child: &Child,
    key: &Key,
    why: &StopReason,
    at: Instant,
    kill_at: Option<Instant>,
) -> (Option<Instant>, bool) {
    let now = Instant::now();
    let at = kill_at.map_or(at, |k| k.min(at));
    let how = if at <= now {
        "SIGKILL now".to_owned()
    } else {
        format!("SIGTERM, SIGKILL in {}", output::duration(at - now))
    };
    let what = match why {
        StopReason::Lost(reason) => format!("lost: {reason}"),
        other => other.to_string(),
    };
    exit::report(&format!(
        "lease on {:?} {what}; stopping the command ({how})",
        key.as_str()
    ));
    if at > now {
        stop_signal(child, libc::SIGTERM);
    }
    (Some(at), at <= now)
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
