//! Writes to a SQLite queue's files by any process, seen through inotify on their directory:
//! what wakes an idle worker when a task is enqueued elsewhere, instead of a polling timer.

use crate::inotify;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// How often [`Wakeups::next`] looks again once the watch has failed (as without one).
const POLL: Duration = Duration::from_millis(50);

/// The least time between two returns of [`Wakeups::next`] woken by writes: on a busy queue an
/// idle worker then looks at most this often, not at every commit of every process (the first
/// write after a quiet spell still wakes it at once).
const GAP: Duration = Duration::from_millis(5);

/// An inotify watch on the directory of the database, for writes to the database file and its
/// journals (`queue.db`, `queue.db-wal`, `queue.db-journal`). Its events are read only by a
/// caller of [`Wakeups::next`]: while nobody waits, they wait in the kernel (where repeats
/// merge), so a busy queue costs its processes nothing here.
#[derive(Debug)]
pub(super) struct Wakeups {
    /// The watch, and when [`Wakeups::next`] last returned for a write.
    fd: tokio::sync::Mutex<(AsyncFd<OwnedFd>, Option<tokio::time::Instant>)>,
    name: Vec<u8>,
}

impl Wakeups {
    /// Watches the directory of the database at `db`.
    ///
    /// # Errors
    /// When inotify cannot be set up (no instance or watch left, a file system without it): the
    /// caller then polls.
    pub(super) fn watch(db: &Path) -> io::Result<Wakeups> {
        let dir = match db.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = db
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
            .as_bytes()
            .to_vec();
        let fd = inotify::open()?;
        let mask = libc::IN_MODIFY | libc::IN_CLOSE_WRITE | libc::IN_CREATE | libc::IN_MOVED_TO;
        inotify::add_watch(&fd, dir, mask)?;
        Ok(Wakeups {
            fd: tokio::sync::Mutex::new((fd, None)),
            name,
        })
    }

    /// Returns once the database was written since the last call returned: at once if it was
    /// meanwhile, else at the next write — but never sooner than [`GAP`] after the last return
    /// for a write; after [`POLL`] if the watch fails. Cancel safe (a write seen by a cancelled
    /// call may be lost to the next, which then returns at the next write or its caller's
    /// bound).
    pub(super) async fn next(&self) {
        let mut state = self.fd.lock().await;
        let (fd, last) = &mut *state;
        self.written(fd).await;
        // Not sooner than GAP after the last return for a write.
        if let Some(at) = last.map(|l| l + GAP) {
            tokio::time::sleep_until(at).await;
        }
        *last = Some(tokio::time::Instant::now());
    }

    /// Returns once a write since the last call is seen (see [`Wakeups::next`]).
    async fn written(&self, fd: &AsyncFd<OwnedFd>) {
        // What came since the last call, all of it (the next call starts afresh).
        let mut ours = false;
        loop {
            match read_events(fd.get_ref(), &self.name) {
                Ok(o) => ours |= o,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return failed(&e).await,
            }
        }
        if ours {
            return;
        }
        loop {
            let mut guard = match fd.readable().await {
                Ok(g) => g,
                Err(e) => return failed(&e).await,
            };
            match read_events(guard.get_inner(), &self.name) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return failed(&e).await,
            }
        }
    }
}

/// After the watch failed: waits as a poll would.
async fn failed(e: &io::Error) {
    tracing::debug!(error = %e, "queue file watch failed; polling");
    tokio::time::sleep(POLL).await;
}

/// Reads the pending events of `fd`: whether one names the database file or a file of its
/// (`NAME-wal`, `NAME-journal`, …).
fn read_events(fd: &OwnedFd, name: &[u8]) -> io::Result<bool> {
    let mut buf = [0u8; 4096];
    let events = inotify::read(fd, &mut buf)?;
    if events.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "inotify closed",
        ));
    }
    let mut ours = false;
    for ev in events {
        // A queue that overflowed dropped events: some may have been ours.
        ours |= ev.name.starts_with(name) || ev.mask & libc::IN_Q_OVERFLOW != 0;
    }
    Ok(ours)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A write to the database's WAL by anyone wakes `next`; a write to another file of the
    /// directory does not; a write between two calls is not lost.
    #[tokio::test]
    async fn writes_to_the_database_files_wake_and_others_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("queue.db");
        let commits = Wakeups::watch(&db).unwrap();
        let wakes = |ms| tokio::time::timeout(Duration::from_millis(ms), commits.next());
        assert!(wakes(50).await.is_err(), "nothing written yet");
        std::fs::write(dir.path().join("other.txt"), b"x").unwrap();
        assert!(wakes(100).await.is_err(), "another file");
        std::fs::write(dir.path().join("queue.db-wal"), b"x").unwrap();
        assert!(wakes(2000).await.is_ok(), "the WAL");
        assert!(wakes(50).await.is_err(), "seen once");
        std::fs::write(&db, b"y").unwrap();
        // Written before the call: still seen.
        assert!(wakes(2000).await.is_ok(), "the database, written before");
    }
}
