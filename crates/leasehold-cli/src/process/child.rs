//! A command's process: started so that it dies with leasehold, signalled by pid or by process
//! group, stopped (SIGTERM, then SIGKILL after a grace period). Used by `run` and `elect`, and by
//! the queue's task supervisor and worker.
//!
//! Signals are sent by pid (or process-group id: the guard's pid, or the child's without a
//! guard), which is safe against reuse because neither is reaped before we stop signalling it.

use crate::exit::{ERROR, SIGNAL_BASE};
use crate::process::signals;
use std::io;
use tokio::process::{Child, Command};

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

/// Sends a termination signal `sig` to the child's process group when it has one of its own (led
/// by the child or by its group guard), else to the child alone; nothing
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

/// Until `at` (a SIGKILL due); never without one.
pub(crate) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Makes the command die (SIGKILL) when the thread that spawned it dies — for a `run` or a worker
/// killed with SIGKILL, so a command never runs without its lease, and a recovered task never
/// next to its orphaned first attempt. (Only the direct child gets the signal; see
/// [`crate::process::group_guard`] for its own children.)
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

/// 128+S.
pub(crate) fn signal_status(sig: libc::c_int) -> u8 {
    u8::try_from(sig).map_or(ERROR, |s| SIGNAL_BASE.saturating_add(s))
}
