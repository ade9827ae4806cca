//! Everything `leasehold run`'s command started, wherever it went: leasehold is the command's
//! child subreaper (`PR_SET_CHILD_SUBREAPER`), so a process whose parent exits is re-parented to
//! leasehold instead of to init — a daemon that double-forked and called `setsid` included. Once
//! the command has exited, [`sweep`] kills leasehold's children with SIGKILL, generation by
//! generation: each one killed hands its own children to leasehold, until none is left.
//!
//! Only leasehold's own children are ever signalled, by pid: a child's pid cannot be reused
//! before its parent reaps it, and leasehold reaps them itself, so no other process can be hit.
//! The process group (see [`crate::process::group_guard`]) covers a `leasehold` killed with SIGKILL; the sweep
//! covers what left that group (`setsid`, `setpgid`), and on a terminal, where the command shares
//! leasehold's group and has no group guard, every process it started.

use std::collections::HashSet;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

/// Makes leasehold the subreaper of its descendants. Call it before the command starts.
pub(crate) fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl(2) with PR_SET_CHILD_SUBREAPER only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A process as `/proc/PID/stat` shows it: its parent and whether it is a zombie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    parent: i32,
    zombie: bool,
}

/// Parses `/proc/PID/stat`: `PID (COMM) STATE PPID …`. The command name may hold spaces and
/// parentheses, so the fields are read after the last `)`.
fn parse_stat(stat: &str) -> Option<Entry> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let parent = fields.next()?.parse().ok()?;
    Some(Entry {
        parent,
        zombie: state == "Z" || state == "X",
    })
}

/// The entry of `pid`, if it still exists.
fn entry(pid: i32) -> Option<Entry> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .as_deref()
        .and_then(parse_stat)
}

/// This process's children, each with whether it is a zombie: from
/// `/proc/self/task/*/children` (a few small files), else, on a kernel without them, from every
/// process's `/proc/PID/stat`.
fn children() -> Vec<(i32, bool)> {
    // SAFETY: getpid(2) only reads.
    let me = unsafe { libc::getpid() };
    let mut pids = HashSet::new();
    let mut listed = false;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                listed = true;
                pids.extend(
                    text.split_ascii_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    if !listed {
        if let Ok(all) = std::fs::read_dir("/proc") {
            pids.extend(
                all.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()),
            );
        }
    }
    pids.into_iter()
        .filter_map(|pid| {
            let e = entry(pid)?;
            (e.parent == me).then_some((pid, e.zombie))
        })
        .collect()
}

/// Reaps the zombies among leasehold's children except `keep` (the command and the group guard,
/// which are waited for where they were started): orphans of the command that exited while it
/// runs, so a long run does not pile them up. Call it on SIGCHLD.
pub(crate) fn reap_orphans(keep: &[u32]) {
    for (pid, zombie) in children() {
        let kept = u32::try_from(pid).is_ok_and(|p| keep.contains(&p));
        if zombie && !kept {
            reap(pid);
        }
    }
}

/// Collects the exit status of our child `pid` if it has exited (without blocking).
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid(2) on a child of ours, without blocking.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}

/// How long killed leftovers of a command may take to exit before its lease is released anyway
/// (SIGKILL cannot be caught; only an uninterruptible system call delays it).
pub(crate) const SWEEP_LIMIT: Duration = Duration::from_secs(5);

/// How often [`sweep`] looks again while killed processes are still exiting.
const SWEEP_EVERY: Duration = Duration::from_millis(10);

/// Kills (SIGKILL) every child of leasehold and reaps it, generation after generation (a killed
/// child's children become leasehold's), until none is left or `limit` has passed (then warns: a
/// process in uninterruptible sleep dies when its system call returns). Call it once the command
/// has exited and been reaped, and the group guard has finished: leasehold then has no other
/// children.
pub(crate) async fn sweep(limit: Duration) {
    sweep_except(limit, &Mutex::new(HashSet::new())).await;
}

/// [`sweep`], sparing the children `keep` names: a queue worker's live task supervisors, while
/// what a dead one left behind (re-parented to the worker, its subreaper) is killed. `keep` is
/// locked while children are listed and killed, so a supervisor started under the same lock and
/// named in it at once is never taken for a leftover.
pub(crate) async fn sweep_except(limit: Duration, keep: &Mutex<HashSet<u32>>) {
    let deadline = tokio::time::Instant::now() + limit;
    let mut refused = HashSet::new();
    loop {
        let left = {
            let keep = keep.lock().unwrap_or_else(|e| e.into_inner());
            let left: Vec<(i32, bool)> = children()
                .into_iter()
                .filter(|&(pid, _)| !u32::try_from(pid).is_ok_and(|p| keep.contains(&p)))
                .collect();
            for &(pid, zombie) in &left {
                // A zombie too: its other threads may still run (a leader that called
                // pthread_exit).
                // SAFETY: kill(2) on our own child, not reaped yet: its pid is not reused.
                let killed = unsafe { libc::kill(pid, libc::SIGKILL) } == 0;
                if !zombie && killed {
                    tracing::info!(pid, "killed a process the command left running");
                } else if !zombie && refused.insert(pid) {
                    let e = io::Error::last_os_error();
                    tracing::warn!(pid, error = %e, "cannot kill a process the command left");
                }
                reap(pid);
            }
            left
        };
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let pids: Vec<i32> = left.iter().map(|&(p, _)| p).collect();
            tracing::warn!(?pids, "processes the command left did not exit in time");
            return;
        }
        tokio::time::sleep(SWEEP_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_whatever_the_command_name() {
        let e = parse_stat("42 (sleep) S 7 42 42 0 -1").unwrap();
        assert_eq!(
            e,
            Entry {
                parent: 7,
                zombie: false
            }
        );
        let odd = parse_stat("43 (a) Z (b c) Z 9 1 1").unwrap();
        assert_eq!(
            odd,
            Entry {
                parent: 9,
                zombie: true
            }
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S notanumber"), None);
    }

    #[test]
    fn children_of_this_process_are_found_and_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        assert!(children().iter().any(|&(p, zombie)| p == pid && !zombie));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!children().iter().any(|&(p, _)| p == pid));
    }
}
