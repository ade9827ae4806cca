//! The store's one inotify instance, which wakes the `acquire`s waiting for a record file.

use super::ofd::hold_is_held;
use crate::store::ChangeWatch;
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by inotify_init1 and is owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: `owned` is a fresh inotify descriptor nobody else uses; AsyncFd owns it now.
        let fd = unsafe { AsyncFd::register(owned) }?;
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
        // SAFETY: buf is valid for its length; the fd is a non-blocking inotify descriptor.
        let n = unsafe {
            libc::read(
                guard.get_inner().as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n <= 0 {
            guard.clear_ready();
            let e = io::Error::last_os_error();
            return n == 0
                || matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                );
        }
        let n = n as usize;
        let mut off = 0usize;
        let mut w = self.watches.lock();
        while off + std::mem::size_of::<libc::inotify_event>() <= n {
            // SAFETY: the kernel wrote whole events; read_unaligned copes with alignment.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
            off += std::mem::size_of::<libc::inotify_event>() + ev.len as usize;
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
                // SAFETY: removing a watch of our own descriptor; errors are harmless.
                unsafe { libc::inotify_rm_watch(self.fd.get_ref().as_raw_fd(), wd) };
            }
        }
        use std::os::unix::ffi::OsStrExt;
        let record = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let mut cpath = path.as_os_str().as_bytes().to_vec();
        cpath.push(0);
        let mask = libc::IN_MODIFY
            | libc::IN_CLOSE_WRITE
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF
            | libc::IN_ATTRIB;
        // SAFETY: cpath is NUL-terminated and outlives the call.
        let wd = unsafe {
            libc::inotify_add_watch(self.fd.get_ref().as_raw_fd(), cpath.as_ptr().cast(), mask)
        };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
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
