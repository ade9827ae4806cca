//! Everything `leasehold run`'s command started, wherever it went: leasehold is the command's
//! child subreaper (`PR_SET_CHILD_SUBREAPER`), so a process whose parent exits is re-parented to
//! leasehold instead of to init — a daemon that double-forked and called `setsid` included — and
//! stays findable as one of leasehold's descendants. [`sweep`] kills them all before the lease is
//! released.
//!
//! The process group (see [`crate::guard`]) covers a `leasehold` killed with SIGKILL; the sweep
//! covers what left that group (`setsid`, `setpgid`), and on a terminal, where the command shares
//! leasehold's group and has no group guard, every process it started.

use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
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

/// Every process on the machine (that can be read) with its entry.
fn processes() -> HashMap<i32, Entry> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // A process may exit between listing and reading: skipped.
        if let Some(entry) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            out.insert(pid, entry);
        }
    }
    out
}

/// The descendants of `root` in `table`, each with its entry.
fn descendants(root: i32, table: &HashMap<i32, Entry>) -> Vec<(i32, Entry)> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (&pid, e) in table {
        children.entry(e.parent).or_default().push(pid);
    }
    let mut out = vec![];
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if let Some(&e) = table.get(&c) {
                out.push((c, e));
                next.push(c);
            }
        }
    }
    out
}

/// Whether `pid` is a live (not zombie) descendant of `root`, following its parents up.
fn is_descendant(pid: i32, root: i32) -> bool {
    let read = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
    };
    let Some(first) = read(pid).filter(|e| !e.zombie) else {
        return false;
    };
    let mut parent = first.parent;
    // Bounded: a parent chain is never this long, and a read racing exits cannot loop forever.
    for _ in 0..4096 {
        if parent == root {
            return true;
        }
        if parent <= 1 {
            return false;
        }
        match read(parent) {
            Some(e) => parent = e.parent,
            None => return false,
        }
    }
    false
}

/// Sends SIGKILL to `pid` if it is still a descendant of `root`: through a pidfd opened first, so
/// that a pid reused in the meantime by an unrelated process is never signalled.
fn kill_descendant(pid: i32, root: i32) {
    // SAFETY: pidfd_open(2) takes a pid and flags; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let Ok(fd) = i32::try_from(fd) else { return };
    if fd < 0 {
        return; // Gone already.
    }
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The descriptor pins the process: if it is ours now, it is the one signalled.
    if !is_descendant(pid, root) {
        return;
    }
    // SAFETY: pidfd_send_signal(2) on a valid pidfd, no siginfo, no flags.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if sent == -1 {
        let e = io::Error::last_os_error();
        tracing::warn!(pid, error = %e, "cannot kill a process the command left");
    } else {
        tracing::info!(pid, "killed a process the command left running");
    }
}

/// Reaps the zombies among leasehold's children except `keep` (the command and the group guard,
/// which are waited for where they were started): orphans of the command that exited while it
/// runs, so a long run does not pile them up. Call it on SIGCHLD.
pub(crate) fn reap_orphans(keep: &[u32]) {
    // SAFETY: getpid(2) only reads.
    let me = unsafe { libc::getpid() };
    for (pid, e) in processes() {
        let kept = u32::try_from(pid).is_ok_and(|p| keep.contains(&p));
        if e.parent == me && e.zombie && !kept {
            let mut status = 0;
            // SAFETY: waitpid(2) on a zombie child of ours, without blocking.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        }
    }
}

/// How often [`sweep`] looks again while killed processes are still exiting.
const SWEEP_EVERY: Duration = Duration::from_millis(10);

/// Kills (SIGKILL) every descendant of leasehold still running, and reaps those re-parented to it,
/// until none is left or `limit` has passed (then warns: a process in uninterruptible sleep dies
/// when its system call returns). Call it once the command has exited and been reaped, and the
/// group guard has finished: leasehold then has no other children, so every zombie child is one
/// of the command's orphans.
pub(crate) async fn sweep(limit: Duration) {
    // SAFETY: getpid(2) only reads.
    let me = unsafe { libc::getpid() };
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left = descendants(me, &processes());
        if left.is_empty() {
            return;
        }
        for &(pid, e) in &left {
            if e.zombie && e.parent == me {
                let mut status = 0;
                // SAFETY: waitpid(2) on a zombie child of ours, without blocking.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            } else if !e.zombie {
                kill_descendant(pid, me);
            }
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
    fn descendants_are_found_through_every_generation() {
        let e = |parent| Entry {
            parent,
            zombie: false,
        };
        let table = HashMap::from([(2, e(1)), (3, e(2)), (4, e(3)), (5, e(1)), (6, e(9))]);
        let mut found: Vec<i32> = descendants(2, &table).iter().map(|d| d.0).collect();
        found.sort_unstable();
        assert_eq!(found, vec![3, 4]);
    }
}
