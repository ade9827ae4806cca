//! The few inotify calls this crate makes, in one place: an instance registered with tokio, watches
//! added and removed, and the pending events read and walked. Used by the file store's notifier
//! (a watch per record file waited for) and by the SQLite queue's watch on its directory.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use tokio::io::unix::AsyncFd;

/// A new inotify instance (non-blocking, close-on-exec), registered with the current tokio
/// runtime's reactor.
pub(crate) fn open() -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by inotify_init1 and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `owned` is a fresh inotify descriptor nobody else uses; AsyncFd owns it now.
    let fd = unsafe { AsyncFd::register(owned) }?;
    Ok(fd)
}

/// Watches `path` for the events in `mask` on the instance `fd`; the watch descriptor.
pub(crate) fn add_watch(fd: &impl AsRawFd, path: &Path, mask: u32) -> io::Result<i32> {
    let mut cpath = path.as_os_str().as_bytes().to_vec();
    cpath.push(0);
    // SAFETY: cpath is NUL-terminated and outlives the call; the descriptor is open.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), cpath.as_ptr().cast(), mask) };
    if wd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(wd)
}

/// Removes the watch `wd` of the instance `fd`; errors (a watch already gone) are harmless.
pub(crate) fn rm_watch(fd: &impl AsRawFd, wd: i32) {
    // SAFETY: removing a watch of the caller's own descriptor; the result is not needed.
    unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) };
}

/// Reads the pending events of the non-blocking instance `fd` into `buf` (one `read`): an error
/// as the read gave it (`WouldBlock` when none is pending), else the events read, none if the
/// read returned nothing.
pub(crate) fn read<'b>(fd: &impl AsRawFd, buf: &'b mut [u8]) -> io::Result<Events<'b>> {
    // SAFETY: buf is valid for its length; the fd is a non-blocking inotify descriptor.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = usize::try_from(n).unwrap_or(0);
    Ok(Events {
        buf: &buf[..n],
        off: 0,
    })
}

/// The events of one [`read`], in order.
#[derive(Debug)]
pub(crate) struct Events<'b> {
    buf: &'b [u8],
    off: usize,
}

impl Events<'_> {
    /// Whether the read returned nothing (the instance was closed).
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// One inotify event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event<'b> {
    /// The watch it is for.
    pub(crate) wd: i32,
    /// What happened (`IN_MODIFY`, `IN_IGNORED`, `IN_Q_OVERFLOW`, …).
    pub(crate) mask: u32,
    /// For a watched directory, the name of the file in it (NUL padding removed); else empty.
    #[cfg_attr(not(feature = "queue"), allow(dead_code))]
    pub(crate) name: &'b [u8],
}

impl<'b> Iterator for Events<'b> {
    type Item = Event<'b>;

    fn next(&mut self) -> Option<Event<'b>> {
        let head = std::mem::size_of::<libc::inotify_event>();
        let (buf, off) = (self.buf, self.off);
        if off + head > buf.len() {
            return None;
        }
        // SAFETY: `head` bytes from `off` are in `buf` (checked above); the kernel wrote whole
        // events; read_unaligned copes with alignment.
        let ev: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
        let len = ev.len as usize;
        let name = buf
            .get(off + head..(off + head + len).min(buf.len()))
            .unwrap_or(&[]);
        // The name is NUL-padded.
        let name = name.split(|b| *b == 0).next().unwrap_or(&[]);
        self.off = off + head + len;
        Some(Event {
            wd: ev.wd,
            mask: ev.mask,
            name,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The bytes of one event as the kernel writes it: the header, then `name` NUL-padded to `len`.
    fn event(wd: i32, mask: u32, name: &[u8], len: u32) -> Vec<u8> {
        let head = libc::inotify_event {
            wd,
            mask,
            cookie: 0,
            len,
        };
        // SAFETY: inotify_event is plain integers; viewing it as bytes reads nothing uninitialised.
        let mut bytes = unsafe {
            std::slice::from_raw_parts(
                (&head as *const libc::inotify_event).cast::<u8>(),
                std::mem::size_of::<libc::inotify_event>(),
            )
        }
        .to_vec();
        let mut padded = name.to_vec();
        padded.resize(len as usize, 0);
        bytes.extend(padded);
        bytes
    }

    #[test]
    fn events_are_walked_in_order_with_names_unpadded_and_a_cut_name_kept_short() {
        let mut buf = event(1, libc::IN_MODIFY, b"", 0);
        buf.extend(event(2, libc::IN_CREATE, b"queue.db-wal", 16));
        let mut cut = event(3, libc::IN_MOVED_TO, b"queue.db", 16);
        cut.truncate(cut.len() - 11); // 5 of its 16 name bytes read
        buf.extend(cut);
        let events = Events { buf: &buf, off: 0 };
        let seen: Vec<(i32, u32, &[u8])> = events.map(|e| (e.wd, e.mask, e.name)).collect();
        assert_eq!(
            seen,
            vec![
                (1, libc::IN_MODIFY, &b""[..]),
                (2, libc::IN_CREATE, &b"queue.db-wal"[..]),
                (3, libc::IN_MOVED_TO, &b"queue"[..]),
            ]
        );
        assert!(Events { buf: &[], off: 0 }.is_empty());
    }

    #[tokio::test]
    async fn a_watched_directory_reports_the_file_written() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open().unwrap();
        let wd = add_watch(&fd, dir.path(), libc::IN_CLOSE_WRITE).unwrap();
        let mut buf = [0u8; 4096];
        let nothing = read(&fd, &mut buf).unwrap_err();
        assert_eq!(nothing.kind(), io::ErrorKind::WouldBlock);
        std::fs::write(dir.path().join("x.lease"), b"{}").unwrap();
        let mut guard = fd.readable().await.unwrap();
        let names: Vec<(i32, Vec<u8>)> = read(guard.get_inner(), &mut buf)
            .unwrap()
            .map(|e| (e.wd, e.name.to_vec()))
            .collect();
        guard.clear_ready();
        assert_eq!(names, vec![(wd, b"x.lease".to_vec())]);
        rm_watch(&fd, wd);
    }
}
