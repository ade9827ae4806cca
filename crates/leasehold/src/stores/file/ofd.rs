//! The two OFD (open-file-description) locks on a record file, both released by the kernel when
//! the process dies (see the [store's docs](super)): byte 0, the holder lock, and byte 1, the
//! mutation lock.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// The holder lock's byte.
pub(super) const HOLD: i64 = 0;
/// The mutation lock's byte.
pub(super) const MUTATE: i64 = 1;

/// The one-byte lock range at `start`, of type `typ` (`F_WRLCK`, `F_RDLCK`, `F_UNLCK`).
fn one_byte(start: i64, typ: libc::c_int) -> libc::flock {
    // SAFETY: an all-zero flock is a valid value; the fields we need are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = 1;
    fl
}

/// Takes (`F_WRLCK`, `F_RDLCK`) or drops (`F_UNLCK`) the one-byte lock at `start` of `fd`, waiting
/// for it if `wait`; `Ok(false)` when it is busy and `wait` is false.
pub(super) fn ofd_lock(fd: RawFd, start: i64, typ: libc::c_int, wait: bool) -> io::Result<bool> {
    let mut fl = one_byte(start, typ);
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    loop {
        // SAFETY: fd is an open descriptor owned by the caller; fl lives across the call.
        let rc = unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) | Some(libc::EACCES) if !wait => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// Whether some open file description holds the holder lock of `file`.
pub(super) fn hold_is_held(file: &File) -> bool {
    let mut fl = one_byte(HOLD, libc::F_WRLCK);
    // SAFETY: the descriptor is open for the duration of the call; fl is valid.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_OFD_GETLK,
            &mut fl as *mut libc::flock,
        )
    };
    // On error, say held: the caller then waits for a write or its timer instead of spinning.
    rc != 0 || fl.l_type != libc::F_UNLCK as libc::c_short
}
