//! `leasehold run`: a command run while holding a lease.
//!
//! When leasehold's stdin is not a terminal (services, cron, CI) the child runs in a process group
//! of its own (led by its group guard, started just before it), and termination signals
//! (forwarded ones, SIGTERM on a lost lease, SIGKILL after the grace period) go to that whole
//! group, so a shell script's children stop with it. On a terminal the child stays in leasehold's
//! group, so interactive commands keep the terminal (and a Ctrl-C, which the terminal sends to
//! that whole group, is not forwarded a second time). The `--on-handoff` signal goes to the child
//! alone. Signals are sent by pid (or process-group id: the guard's pid, or the child's without a
//! guard), which is safe against reuse because neither is reaped before we stop signalling it.
//! The command dies with leasehold (`PR_SET_PDEATHSIG`), and its process group with it
//! ([`crate::guard`]). When the command ends, whatever it left running — in its group or
//! not (`setsid`), on a terminal too — is killed before the lease is released ([`crate::tree`]).

use crate::admin::key_arg;
use crate::cli::{LeaseArgs, RunArgs};
use crate::exit::{self, Failure, CANNOT_EXECUTE, ERROR, LOST, NOT_FOUND, SIGNAL_BASE};
use crate::guard::Guard;
use crate::metrics::{self, Endpoint};
use crate::signals::SignalArg;
use crate::signals::{self, Forwarded, Received};
use crate::tree;
use leasehold::{Error, Key, LeaseGuard, LockBuilder, Locks, LostReason, Released, Wait};
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

/// `leasehold run`.
pub(crate) async fn run(store_url: Option<&str>, args: RunArgs) -> Result<u8, Failure> {
    let key = key_arg(&args.lease.key)?;
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Failure::usage(
            "no command to run: leasehold run --key KEY -- CMD [ARGS...]",
        ));
    };
    // From here on SIGTERM/SIGINT/SIGHUP are ours to handle: while waiting they end the wait,
    // while the command runs they are forwarded to it.
    let mut signals = Forwarded::install()
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let endpoint = Endpoint::given(args.lease.metrics);
    let locks = metrics::locks(store_url, endpoint.as_ref()).await?;
    Endpoint::serve_given(endpoint).await?;
    let builder = lease_builder(&locks, &key, &args.lease);
    let guard = obtain(builder, &key, args.lease.no_wait, &mut signals).await?;
    let command = Supervised {
        program,
        args: program_args,
        grace: args.grace,
        on_handoff: args.on_handoff,
    };
    match supervise(&locks, &guard, &key, &command, &mut signals).await? {
        Ended::Status(code) => Ok(code),
        Ended::Lost(_) => Ok(LOST),
    }
}

/// The acquisition `lease` asks for: its TTL, wait and labels.
pub(crate) fn lease_builder(locks: &Locks, key: &Key, lease: &LeaseArgs) -> LockBuilder {
    let mut builder = locks.lock_key(key.clone()).ttl(lease.ttl);
    builder = match (lease.no_wait, lease.wait) {
        // One attempt; held elsewhere is `Error::Timeout` naming the holder, and a store error
        // stays a store error (exit 1), not "not obtained".
        (true, _) => builder.wait_policy(Wait::No),
        (false, Some(limit)) => builder.wait(limit),
        (false, None) => builder.wait_policy(Wait::Forever),
    };
    for (name, value) in &lease.labels {
        builder = builder.label(name, value);
    }
    builder
}

/// Waits for the lease as `builder` says, ended early by SIGTERM, SIGINT or SIGHUP (a failure
/// with status 128+S).
pub(crate) async fn obtain(
    builder: LockBuilder,
    key: &Key,
    no_wait: bool,
    signals: &mut Forwarded,
) -> Result<LeaseGuard, Failure> {
    let guard = tokio::select! {
        biased;
        got = builder.acquire() => got.map_err(|e| not_obtained(key, e, no_wait))?,
        sig = signals.recv() => {
            return Err(Failure::new(
                signal_status(sig.signal),
                format!("{} received while waiting for the lease on {:?}", signals::name(sig.signal), key.as_str()),
            ));
        }
    };
    tracing::info!(key = %key, fence = guard.fence(), "lease acquired");
    Ok(guard)
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

/// How a command run under a lease ended.
pub(crate) enum Ended {
    /// It exited (by itself, or stopped by a signal leasehold got): leasehold's exit status, the
    /// lease released.
    Status(u8),
    /// The lease was lost and the command stopped.
    Lost(LostReason),
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

/// The one line for a lease not obtained: who holds it.
fn not_obtained(key: &Key, e: Error, no_wait: bool) -> Failure {
    match e {
        Error::Timeout { holder, waited, .. } => {
            let how = if no_wait {
                "(--no-wait)".to_owned()
            } else {
                format!("after waiting {}", crate::output::duration(waited))
            };
            Failure::new(
                exit::NOT_OBTAINED,
                format!(
                    "lease on {:?} not obtained {how}: held by {}",
                    key.as_str(),
                    crate::output::clean(&holder)
                ),
            )
        }
        other => other.into(),
    }
}

/// Sends `sig` to the child unless it has been reaped already.
pub(crate) fn signal_child(child: &Child, sig: libc::c_int) {
    let Some(pid) = child.id() else { return };
    match signals::send(pid, sig) {
        Ok(()) => tracing::debug!(pid, signal = %signals::name(sig), "signalled the command"),
        Err(e) => {
            tracing::warn!(pid, signal = %signals::name(sig), error = %e, "cannot signal the command")
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

/// Sends a termination signal `sig` to the child's process group when it has one of its own (led
/// by the child or by its group guard; see the module docs), else to the child alone; nothing
/// once it has been reaped.
pub(crate) fn stop_signal(child: &Child, sig: libc::c_int) {
    let Some(pid) = child.id() else { return };
    // SAFETY: getpgrp(2) only reads.
    let ours = unsafe { libc::getpgrp() };
    let group = signals::group_of(pid)
        .filter(|g| *g != ours)
        .and_then(|g| u32::try_from(g).ok());
    let own_group = group.is_some();
    let sent = match group {
        Some(g) => signals::send_group(g, sig),
        None => signals::send(pid, sig),
    };
    match sent {
        Ok(()) => {
            tracing::debug!(pid, group = own_group, signal = %signals::name(sig), "signalled the command")
        }
        Err(e) => {
            tracing::warn!(pid, signal = %signals::name(sig), error = %e, "cannot signal the command")
        }
    }
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

/// Stops the child: SIGTERM, then SIGKILL once `grace` has passed; returns how it ended.
pub(crate) async fn stop_child(child: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    stop_signal(child, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            tracing::warn!(grace = %humantime::format_duration(grace), "the command did not exit in time; sending SIGKILL");
            stop_signal(child, libc::SIGKILL);
            child.wait().await
        }
    }
}

/// Makes the command die (SIGKILL) when the thread that spawned it dies — for a `run` or a worker
/// killed with SIGKILL, so a command never runs without its lease, and a recovered task never
/// next to its orphaned first attempt. (Only the direct child gets the signal; see
/// [`crate::guard`] for its own children.)
pub(crate) fn die_with_parent(command: &mut Command) {
    // SAFETY: prctl is async-signal-safe; called between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
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

/// Tells that the lease on `key` could not be released (`e`): it expires by its TTL.
pub(crate) fn release_failed(key: &Key, e: &Error) {
    exit::report(&format!(
        "cannot release the lease on {:?}: {e}; it expires by its TTL",
        key.as_str()
    ));
}

/// leasehold's exit status for the child's: its code, or 128+S if signal S ended it.
fn exit_status(status: io::Result<ExitStatus>) -> Result<u8, Failure> {
    let status = status.map_err(|e| Failure::error(format!("cannot wait for the command: {e}")))?;
    if let Some(code) = status.code() {
        return Ok(u8::try_from(code & 0xff).unwrap_or(ERROR));
    }
    Ok(status.signal().map_or(ERROR, signal_status))
}

/// 128+S.
pub(crate) fn signal_status(sig: libc::c_int) -> u8 {
    u8::try_from(sig).map_or(ERROR, |s| SIGNAL_BASE.saturating_add(s))
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

    #[test]
    fn not_obtained_names_the_holder() {
        let key = Key::new("k").unwrap();
        let e = Error::Timeout {
            key: "k".into(),
            holder: "host-1-abc".into(),
            waited: Duration::from_millis(300),
        };
        let f = not_obtained(&key, e, false);
        assert_eq!(f.code, exit::NOT_OBTAINED);
        assert!(f.message.contains("held by host-1-abc"), "{}", f.message);
        assert!(f.message.contains("300ms"), "{}", f.message);
    }
}
