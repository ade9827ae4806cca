//! The store's one inotify instance, which wakes the `acquire`s waiting for a record file.

use super::ofd::hold_is_held;
use crate::inotify;
use crate::store::ChangeWatch;
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// The store's one inotify instance. Every waiting `acquire` registers the record file it waits
/// for; one task reads the events and wakes the waiters of that file. The instance is never closed
/// on the acquire path (closing an inotify descriptor waits for a kernel grace period, milliseconds),
/// and unused watches are removed in batches.
///
/// Wakes on writes (a release rewrites the record), on deletion, and on a writer closing the file
/// only if the holder lock went from held to free — the holder died. Closes are everywhere (every
/// acquisition attempt opens and closes the file), so closes alone do not wake anyone.
#[derive(Debug)]
pub(super) struct Notifier {
    fd: AsyncFd<OwnedFd>,
    watches: Mutex<Watches>,
}

#[derive(Debug, Default)]
struct Watches {
    by_wd: HashMap<i32, Watched>,
    by_path: HashMap<PathBuf, i32>,
}

#[derive(Debug)]
struct Watched {
    path: PathBuf,
    tx: tokio::sync::watch::Sender<()>,
    record: File,
    hold_held: bool,
}

/// Unused watches kept before a sweep removes them.
const IDLE_WATCHES: usize = 1024;

impl Notifier {
    pub(super) fn start() -> io::Result<Arc<Self>> {
        let fd = inotify::open()?;
        let n = Arc::new(Notifier {
            fd,
            watches: Mutex::new(Watches::default()),
        });
        let weak = Arc::downgrade(&n);
        tokio::spawn(async move {
            while let Some(n) = weak.upgrade() {
                if !n.pump().await {
                    return;
                }
            }
        });
        Ok(n)
    }

    /// Waits for events and dispatches them; false when the descriptor failed.
    async fn pump(&self) -> bool {
        let Ok(mut guard) = self.fd.readable().await else {
            return false;
        };
        let mut buf = [0u8; 8192];
        let events = match inotify::read(guard.get_inner(), &mut buf) {
            Ok(events) if !events.is_empty() => events,
            nothing => {
                guard.clear_ready();
                return match nothing {
                    Ok(_) => true,
                    Err(e) => matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ),
                };
            }
        };
        let mut w = self.watches.lock();
        for ev in events {
            if ev.mask & libc::IN_IGNORED != 0 {
                // The file is gone (cleanup): wake its waiters and forget it.
                if let Some(gone) = w.by_wd.remove(&ev.wd) {
                    if w.by_path.get(&gone.path) == Some(&ev.wd) {
                        w.by_path.remove(&gone.path);
                    }
                    gone.tx.send_replace(());
                }
                continue;
            }
            let Some(entry) = w.by_wd.get_mut(&ev.wd) else {
                continue;
            };
            let was_held = std::mem::replace(&mut entry.hold_held, hold_is_held(&entry.record));
            let only_close = ev.mask & !libc::IN_CLOSE_WRITE == 0;
            if !only_close || (was_held && !entry.hold_held) {
                entry.tx.send_replace(());
            }
        }
        true
    }

    pub(super) fn watch(self: &Arc<Self>, path: &Path) -> io::Result<FileWatch> {
        let mut w = self.watches.lock();
        if let Some(wd) = w.by_path.get(path) {
            if let Some(e) = w.by_wd.get(wd) {
                return Ok(FileWatch {
                    rx: e.tx.subscribe(),
                });
            }
        }
        let idle = w
            .by_wd
            .values()
            .filter(|e| e.tx.receiver_count() == 0)
            .count();
        if idle >= IDLE_WATCHES {
            // Drop every unused watch. Rare: only after many distinct keys were waited for.
            let unused: Vec<i32> = w
                .by_wd
                .iter()
                .filter(|(_, e)| e.tx.receiver_count() == 0)
                .map(|(wd, _)| *wd)
                .collect();
            for wd in unused {
                if let Some(e) = w.by_wd.remove(&wd) {
                    w.by_path.remove(&e.path);
                }
                inotify::rm_watch(self.fd.get_ref(), wd);
            }
        }
        let record = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let mask = libc::IN_MODIFY
            | libc::IN_CLOSE_WRITE
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF
            | libc::IN_ATTRIB;
        let wd = inotify::add_watch(self.fd.get_ref(), path, mask)?;
        // The same inode may already be watched under another path entry (a stale one).
        if let Some(e) = w.by_wd.get(&wd) {
            let rx = e.tx.subscribe();
            w.by_path.insert(path.to_path_buf(), wd);
            return Ok(FileWatch { rx });
        }
        let hold_held = hold_is_held(&record);
        let (tx, rx) = tokio::sync::watch::channel(());
        w.by_wd.insert(
            wd,
            Watched {
                path: path.to_path_buf(),
                tx,
                record,
                hold_held,
            },
        );
        w.by_path.insert(path.to_path_buf(), wd);
        Ok(FileWatch { rx })
    }
}

/// One waiter's subscription to a record file.
#[derive(Debug)]
pub(super) struct FileWatch {
    rx: tokio::sync::watch::Receiver<()>,
}

#[async_trait]
impl ChangeWatch for FileWatch {
    async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            // The file was removed (cleanup) and its watch dropped: poll gently.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
