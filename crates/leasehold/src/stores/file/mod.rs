//! The file store (`file:///path/to/dir`), the embedded default: one JSON record file per key.
//!
//! Checklist — native TTL: no (expiry judged on the host's boot-time clock, `CLOCK_BOOTTIME`,
//! which every process on the host shares and no NTP step or date change moves; a record of
//! another boot, or one written without boot-time stamps, on the wall clock); watch: yes (inotify
//! on the record file); liveness: yes (a kernel lock); fence:
//! `max(previous + 1, now in µs)` kept in the record, so it survives release, expiry and restarts;
//! before `cleanup` deletes a record it raises the directory's fence high-water mark (the file
//! `.leasehold-fences`) to the record's fence, and a record created again, or recovered from
//! damage, is granted a fence above that mark: no clock decides it.
//!
//! # How it works
//! Each key has a file `<name>.lease` (see [`crate::Naming::file`]) holding the record as pretty JSON.
//! Two open-file-description (OFD) locks on it, both released by the kernel when the process dies:
//! * byte 1, the **mutation lock**, is taken around every read-decide-write of the record, so
//!   processes on the host serialise their changes;
//! * byte 0, the **holder lock**, is held by the lease holder for as long as it holds the lease. An
//!   acquirer that can take it while the record says the holder had it knows the holder is dead
//!   (SIGKILL, crash) and takes the lease at once. A holder that is alive but stopped (SIGSTOP) keeps
//!   the kernel lock, so its lease is taken over by the TTL; the new holder then holds the lease
//!   without the kernel lock (`"kernel_lock": "none"` in the record) and picks it up at a renewal.
//!
//! Records are rewritten in place (padded with spaces, never truncated), so a reader never sees a
//! missing file while a lease exists. A torn record (crash mid-write, disk trouble, a hand edit) is
//! reported by `inspect` as corrupt and recovered by `acquire`, taking the largest fence found in the
//! damaged bytes or the µs clock, whichever is larger.
//!
//! # Rules
//! The store keeps no rules of its own: each step reads the record under the file's lock, asks
//! `crate::decide`, and writes what it answers.
//!
//! | step | rule |
//! | --- | --- |
//! | acquire (locks and permits) | acquire → `decide::Rules::acquire` |
//! | renew | renew → `decide::Rules::renew` |
//! | release | release → `decide::Rules::release` |
//! | a waiter's withdrawal | the line's `leave_line` |
//! | force release | freed → `decide::Rules::freed` |
//! | cleanup | removable → `decide::Rules::removable` |
//!
//! # Clocks
//! Each record keeps its deadlines (the lease's `expires`, `waiter_expires`, each queued place's
//! and each permit's `expires`) as wall-clock times for people, each as the process that set it
//! wrote it, and, in its `store` entries, on the boot-time clock (`expires_boottime_ms`,
//! `waiter_expires_boottime_ms`, `queue_expires_boottime_ms/<token>`,
//! `permit_expires_boottime_ms/<token>`) with the `boot_id` of the boot that wrote them. A process
//! of the same boot judges expiry on the boot-time stamps, so setting the wall clock (by hand, by
//! an NTP step, or a process whose clock is faked) neither shortens nor lengthens a lease or a
//! place in line; `inspect` and `list` show the deadlines on the reader's wall clock, from the
//! stamps. After a reboot every holder is gone (the kernel locks are free) and the wall-clock
//! times are used. A process in a Linux time namespace reads the boot-time clock less its
//! namespace's offset, so every stamp is on the host's clock; one that cannot tell its offset is
//! refused ([`Error::NotSupported`]; see `boot`).
//!
//! # Durability
//! By default records are not fsynced: leases are about live processes, and without an OS crash the
//! page cache is as durable as the disk for every process on the host. With `?fsync=true` each write
//! is followed by `fdatasync`, which keeps fences monotonic across power loss too, at the cost
//! measured in the README.
//!
//! # Security
//! Names never contain `/` nor start with `.`; files are opened with `O_NOFOLLOW`, created with mode
//! 0600 (`?mode=0640` to share with a group); the directory is created (0700 plus group/other
//! search bits matching the mode) if missing.

use crate::decide::{self, Current, Now, Rules};
use crate::error::{Error, Result};
use crate::key::{Key, Naming};
use crate::record::{now_ms, LeaseRecord};
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, ReleaseOutcome, RenewOutcome,
};
use async_trait::async_trait;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod boot;
mod floor;
mod notify;
mod ofd;
mod options;

use notify::Notifier;
use ofd::{ofd_lock, HOLD, MUTATE};
pub use options::FileOptions;
pub(crate) use options::FileUrl;

const EXT: &str = ".lease";
const KERNEL_LOCK: &str = "kernel_lock";

/// The file store. See the [module docs](self).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = tempfile::tempdir().unwrap();
/// let store = leasehold::stores::file::FileStore::open(dir.path(), Default::default())?;
/// let locks = leasehold::Locks::new(store);
/// let guard = locks.lock("user:alice")?.try_acquire().await?.expect("free");
/// guard.release().await?;
/// # Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    opts: FileOptions,
    naming: Naming,
    /// Open record files of the leases this store holds, by owner token.
    held: Mutex<HashMap<String, Held>>,
    /// The store's one inotify instance, made on first use.
    notifier: std::sync::OnceLock<std::result::Result<Arc<Notifier>, String>>,
}

#[derive(Debug)]
struct Held {
    file: Arc<File>,
    kernel: bool,
}

/// What was found in a record file.
enum Found {
    Missing,
    Corrupt {
        detail: String,
        salvaged: Option<u64>,
    },
    Record(LeaseRecord),
}

impl Found {
    /// What the decision sees; `free` is whether no process holds the record's kernel lock,
    /// which alone tells that a record that cannot be read is held by nobody.
    fn current(&self, free: bool) -> Current<'_> {
        match self {
            Found::Missing => Current::Missing,
            Found::Corrupt { salvaged, .. } => Current::Corrupt {
                salvaged_fence: *salvaged,
                over: free,
            },
            Found::Record(r) => Current::Record(r),
        }
    }
    fn record(&self) -> Option<&LeaseRecord> {
        match self {
            Found::Record(r) => Some(r),
            _ => None,
        }
    }
}

impl Inner {
    fn path(&self, key: &Key) -> PathBuf {
        let mut name = self.naming.name(key);
        name.push_str(EXT);
        self.dir.join(name)
    }

    fn io_err(&self, op: &'static str, path: &Path, e: io::Error) -> Error {
        Error::io(op, path.display(), e)
    }

    fn open(&self, path: &Path, create: bool) -> Result<Option<File>> {
        let mut o = OpenOptions::new();
        o.read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        if create {
            o.create(true).mode(self.opts.mode);
        }
        match o.open(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(Error::Corrupt {
                key: path.display().to_string(),
                detail: "is a symbolic link; refusing to follow it".into(),
            }),
            Err(e) => Err(self.io_err("open", path, e)),
        }
    }

    /// Takes the mutation lock of `file`, checks the file is still linked, runs `f`, writes what it
    /// returns, unlocks. `Ok(None)`: the lock was busy and `wait` was false, or the file was unlinked
    /// by cleanup (the caller reopens).
    fn mutate<T>(
        &self,
        path: &Path,
        file: &File,
        wait: bool,
        f: impl FnOnce(&Found) -> (T, Option<LeaseRecord>),
    ) -> Result<Option<Step<T>>> {
        let fd = file.as_raw_fd();
        if !ofd_lock(fd, MUTATE, libc::F_WRLCK as libc::c_int, wait)
            .map_err(|e| self.io_err("lock", path, e))?
        {
            return Ok(None);
        }
        let res = (|| {
            let meta = file.metadata().map_err(|e| self.io_err("stat", path, e))?;
            if std::os::unix::fs::MetadataExt::nlink(&meta) == 0 {
                return Ok(Step::Unlinked);
            }
            let (mut found, len) = read_record(file).map_err(|e| self.io_err("read", path, e))?;
            // Deadlines are judged on the host's boot-time clock (see `boot`).
            let clocks = self.clocks()?;
            let raw = found.record().cloned();
            if let (Found::Record(r), Some(c)) = (&mut found, &clocks) {
                boot::view(r, c);
            }
            let (out, write) = f(&found);
            if let Some(mut rec) = write {
                boot::stamp(&mut rec, raw.as_ref(), found.record(), clocks.as_ref());
                self.write_record(path, file, &rec, len)?;
            }
            Ok(Step::Done(out))
        })();
        let _ = ofd_lock(fd, MUTATE, libc::F_UNLCK as libc::c_int, false);
        res.map(Some)
    }

    fn write_record(
        &self,
        path: &Path,
        file: &File,
        rec: &LeaseRecord,
        old_len: usize,
    ) -> Result<()> {
        let mut bytes = serde_json::to_vec_pretty(rec).map_err(|e| Error::Store {
            source: None,
            store: self.describe(),
            detail: e.to_string(),
            retryable: false,
        })?;
        bytes.push(b'\n');
        self.write_in_place(path, file, bytes, old_len)
    }

    /// Writes `bytes` over the file from its start, padded with spaces to `old_len` (a file is
    /// never truncated), and fsyncs it with `?fsync=true`.
    fn write_in_place(
        &self,
        path: &Path,
        file: &File,
        mut bytes: Vec<u8>,
        old_len: usize,
    ) -> Result<()> {
        if bytes.len() < old_len {
            bytes.resize(old_len, b' ');
        }
        file.write_all_at(&bytes, 0)
            .map_err(|e| self.io_err("write", path, e))?;
        if self.opts.fsync {
            file.sync_data()
                .map_err(|e| self.io_err("fdatasync", path, e))?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    /// This process's clocks for a decision ([`boot::now`]); refused when its boot-time clock
    /// cannot be placed on the host's.
    fn clocks(&self) -> Result<Option<boot::Clocks>> {
        boot::now().map_err(|why| Error::NotSupported {
            store: self.describe(),
            what: format!("judging leases on the host's boot-time clock from this process: {why}"),
        })
    }

    fn acquire(&self, req: &AcquireRequest, wait: bool) -> Result<Option<AcquireOutcome>> {
        let path = self.path(&req.key);
        loop {
            let Some(file) = self.open(&path, true)? else {
                continue;
            };
            let fd = file.as_raw_fd();
            let mut kernel = false;
            let step = self.mutate(&path, &file, wait, |found| {
                // A record with no fence of its own (new, or damaged) is fenced above every
                // record cleanup deleted: the high-water mark, read under this file's lock, after
                // any deletion of an earlier file of this key.
                let floor = match found {
                    Found::Record(_) => 0,
                    Found::Missing | Found::Corrupt { .. } => match self.high_water() {
                        Ok(mark) => mark.saturating_add(req.fences.max(1)),
                        Err(e) => return (Err(e), None),
                    },
                };
                // The holder lock is tried under the mutation lock, so a losing attempt never
                // holds it while another process is being granted the lease. Permits hold none
                // (they are many): they end by their TTLs, and a damaged record of a permit key
                // stays held until a lock request finds no kernel lock on it.
                kernel = req.permit.is_none()
                    && ofd_lock(fd, HOLD, libc::F_WRLCK as libc::c_int, false).unwrap_or(false);
                let dead = kernel
                    && found.record().is_some_and(|r| {
                        r.token.is_some()
                            && r.store.get(KERNEL_LOCK).map(String::as_str) == Some("held")
                    });
                let mut rules = Rules::clock(Now::wall());
                rules.fence_floor = rules.fence_floor.max(floor);
                let (out, write) = match rules.acquire(found.current(kernel), req, dead) {
                    Ok(d) => (d.outcome, d.write),
                    Err(e) => {
                        if kernel {
                            let _ = ofd_lock(fd, HOLD, libc::F_UNLCK as libc::c_int, false);
                            kernel = false;
                        }
                        return (Err(e), None);
                    }
                };
                match (out, write) {
                    (AcquireOutcome::Granted(r), Some(w)) if req.permit.is_some() => {
                        (Ok(AcquireOutcome::Granted(r)), Some(w))
                    }
                    (AcquireOutcome::Granted(mut r), Some(_)) => {
                        r.store.insert(
                            KERNEL_LOCK.into(),
                            if kernel { "held" } else { "none" }.into(),
                        );
                        (Ok(AcquireOutcome::Granted(r.clone())), Some(r))
                    }
                    (out, write) => {
                        if kernel {
                            let _ = ofd_lock(fd, HOLD, libc::F_UNLCK as libc::c_int, false);
                            kernel = false;
                        }
                        (Ok(out), write)
                    }
                }
            })?;
            match step {
                None => return Ok(None),
                Some(Step::Unlinked) => continue,
                Some(Step::Done(out)) => {
                    let out = out?;
                    if let AcquireOutcome::Granted(_) = &out {
                        self.held.lock().insert(
                            req.token.clone(),
                            Held {
                                file: Arc::new(file),
                                kernel,
                            },
                        );
                    }
                    return Ok(Some(out));
                }
            }
        }
    }

    fn held_file(&self, token: &str) -> Option<(Arc<File>, bool)> {
        self.held
            .lock()
            .get(token)
            .map(|h| (h.file.clone(), h.kernel))
    }

    fn renew(
        &self,
        key: &Key,
        token: &str,
        ttl: Duration,
        wait: bool,
    ) -> Result<Option<RenewOutcome>> {
        let path = self.path(key);
        let (file, kernel) = match self.held_file(token) {
            Some(h) => h,
            None => match self.open(&path, false)? {
                Some(f) => (Arc::new(f), false),
                None => return Ok(Some(RenewOutcome::Lost(crate::store::LostReason::Released))),
            },
        };
        let mut upgraded = false;
        let step = self.mutate(&path, &file, wait, |found| {
            let d = Rules::clock(Now::wall()).renew(found.record(), token, crate::record::ms(ttl));
            match (d.outcome, d.write) {
                // A permit holds no kernel lock (see acquire).
                (RenewOutcome::Renewed(mut r), Some(w)) if w.permits.is_none() => {
                    if !kernel
                        && ofd_lock(file.as_raw_fd(), HOLD, libc::F_WRLCK as libc::c_int, false)
                            .unwrap_or(false)
                    {
                        upgraded = true;
                        r.store.insert(KERNEL_LOCK.into(), "held".into());
                    }
                    (RenewOutcome::Renewed(r.clone()), Some(r))
                }
                other => other,
            }
        })?;
        match step {
            None => Ok(None),
            Some(Step::Unlinked) => {
                self.held.lock().remove(token);
                Ok(Some(RenewOutcome::Lost(crate::store::LostReason::Released)))
            }
            Some(Step::Done(out)) => {
                match &out {
                    RenewOutcome::Lost(_) => {
                        self.held.lock().remove(token);
                    }
                    RenewOutcome::Renewed(_) if upgraded => {
                        if let Some(h) = self.held.lock().get_mut(token) {
                            h.kernel = true;
                        }
                    }
                    _ => {}
                }
                Ok(Some(out))
            }
        }
    }

    fn release(&self, key: &Key, token: &str, wait: bool) -> Result<Option<ReleaseOutcome>> {
        let path = self.path(key);
        let file = match self.held_file(token) {
            Some((f, _)) => f,
            None => match self.open(&path, false)? {
                Some(f) => Arc::new(f),
                None => return Ok(Some(ReleaseOutcome::NotHeld)),
            },
        };
        let step = self.mutate(&path, &file, wait, |found| {
            let d = Rules::clock(Now::wall()).release(found.record(), token);
            let (out, write) = (d.outcome, d.write);
            if write.is_some() {
                // Drop the holder lock while the mutation lock is still ours, so the next acquirer
                // sees a free record and a free kernel lock together.
                let _ = ofd_lock(file.as_raw_fd(), HOLD, libc::F_UNLCK as libc::c_int, false);
            }
            (out, write)
        })?;
        match step {
            None => Ok(None),
            Some(Step::Unlinked) => {
                self.held.lock().remove(token);
                Ok(Some(ReleaseOutcome::NotHeld))
            }
            Some(Step::Done(out)) => {
                self.held.lock().remove(token);
                Ok(Some(out))
            }
        }
    }

    fn simple<T>(
        &self,
        key: &Key,
        wait: bool,
        missing: T,
        f: impl FnOnce(&Found) -> (T, Option<LeaseRecord>),
    ) -> Result<Option<T>> {
        let path = self.path(key);
        let Some(file) = self.open(&path, false)? else {
            return Ok(Some(missing));
        };
        match self.mutate(&path, &file, wait, f)? {
            None => Ok(None),
            Some(Step::Unlinked) => Ok(Some(missing)),
            Some(Step::Done(t)) => Ok(Some(t)),
        }
    }

    fn read_shared(&self, path: &Path) -> Result<Option<Found>> {
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io_err("open", path, e)),
        };
        let fd = file.as_raw_fd();
        ofd_lock(fd, MUTATE, libc::F_RDLCK as libc::c_int, true)
            .map_err(|e| self.io_err("lock", path, e))?;
        let res = read_record(&file).map_err(|e| self.io_err("read", path, e));
        let _ = ofd_lock(fd, MUTATE, libc::F_UNLCK as libc::c_int, false);
        Ok(Some(res?.0))
    }

    fn inspection(&self, name: String, found: Found) -> Option<Inspection> {
        match found {
            Found::Missing => None,
            Found::Record(mut r) => {
                // The deadlines on this process's wall clock, from their boot-time stamps, as a
                // decision would see them (left as written when this process cannot tell).
                if let Ok(Some(c)) = boot::now() {
                    boot::view(&mut r, &c);
                }
                Some(Inspection::Record(r))
            }
            Found::Corrupt { detail, .. } => Some(Inspection::Corrupt { name, detail }),
        }
    }

    fn entries(&self) -> Result<Vec<(String, PathBuf)>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(self.io_err("read directory", &self.dir, e)),
        };
        let mut out = vec![];
        for entry in rd {
            let entry = entry.map_err(|e| self.io_err("read directory", &self.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || !name.ends_with(EXT) {
                continue;
            }
            out.push((name.to_owned(), entry.path()));
        }
        out.sort();
        Ok(out)
    }

    fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        let mut out = vec![];
        for (name, path) in self.entries()? {
            let Some(found) = self.read_shared(&path)? else {
                continue;
            };
            match &found {
                Found::Record(r) if !r.key.starts_with(prefix) => continue,
                // A corrupt record has no readable key: it is listed under the empty prefix only.
                Found::Corrupt { .. } if !prefix.is_empty() => continue,
                _ => {}
            }
            if let Some(i) = self.inspection(name, found) {
                out.push(i);
            }
        }
        Ok(out)
    }

    fn cleanup(&self, older_than: Duration, progress: &CleanupProgress) -> Result<CleanupReport> {
        let mut report = CleanupReport::default();
        let now = Now::wall();
        let entries = self.entries()?;
        progress.add_found(entries.len() as u64);
        for (_, path) in entries {
            let Some(file) = self.open(&path, false)? else {
                // Deleted by another process since the listing: done, neither removed nor kept.
                progress.add_done(1);
                continue;
            };
            let step = self.mutate(&path, &file, true, |found| {
                let remove = match found {
                    Found::Missing => true,
                    Found::Record(r) => Rules::clock(now).removable(r, None, older_than),
                    Found::Corrupt { .. } => false,
                };
                if !remove {
                    return (Ok(false), None);
                }
                // The record's fences stay below every later grant of the key: the mark first.
                if let Some(r) = found.record() {
                    if let Err(e) = self.raise_high_water(r.fence) {
                        return (Err(e), None);
                    }
                }
                // Unlink while the mutation lock is held: anyone who opened the old file before
                // (an acquirer between its kernel-lock try and its mutation, a stale holder that
                // was taken over) sees nlink == 0 under the lock and reopens or learns it lost.
                // Held records are never removable, so the holder lock need not be consulted.
                (Ok(std::fs::remove_file(&path).is_ok()), None)
            })?;
            let removed = match step {
                Some(Step::Done(removed)) => removed?,
                _ => false,
            };
            if removed {
                report.removed += 1;
            } else {
                report.kept += 1;
            }
            progress.add_done(1);
        }
        Ok(report)
    }
}

/// The file of a directory's fence high-water mark: `{"fence": N}`, at least every fence of
/// every record `cleanup` deleted from it. Its name starts with a dot, which no record's does.
const HIGH_WATER_FILE: &str = ".leasehold-fences";

impl Inner {
    /// The directory's fence high-water mark (0 without one), read under its mutation lock.
    ///
    /// # Errors
    /// An I/O error; [`Error::Corrupt`] when the file holds no fence that can be read, since no
    /// fence on a new record could then be known to be above every deleted one.
    fn high_water(&self) -> Result<u64> {
        let path = self.dir.join(HIGH_WATER_FILE);
        let Some(file) = self.open(&path, false)? else {
            return Ok(0);
        };
        self.with_mark(&path, &file, |bytes| Ok((read_mark(bytes), None)))?
            .ok_or_else(|| Error::Corrupt {
                key: path.display().to_string(),
                detail: "holds no fence: no lease on a new record is granted until it is repaired or removed".into(),
            })
    }

    /// Raises the directory's fence high-water mark to at least `fence`.
    fn raise_high_water(&self, fence: u64) -> Result<()> {
        let path = self.dir.join(HIGH_WATER_FILE);
        let file = self
            .open(&path, true)?
            .ok_or_else(|| self.io_err("open", &path, io::ErrorKind::NotFound.into()))?;
        self.with_mark(&path, &file, |bytes| {
            let mark = read_mark(bytes).unwrap_or(0);
            Ok(((), (mark < fence).then_some(fence)))
        })
    }

    /// Runs `f` on the mark file's bytes under its mutation lock, and writes the mark it returns.
    fn with_mark<T>(
        &self,
        path: &Path,
        file: &File,
        f: impl FnOnce(&[u8]) -> Result<(T, Option<u64>)>,
    ) -> Result<T> {
        let fd = file.as_raw_fd();
        ofd_lock(fd, MUTATE, libc::F_WRLCK as libc::c_int, true)
            .map_err(|e| self.io_err("lock", path, e))?;
        let res = (|| {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut io::Read::take(file, READ_LIMIT as u64), &mut bytes)
                .map_err(|e| self.io_err("read", path, e))?;
            let (out, write) = f(&bytes)?;
            if let Some(mark) = write {
                let text = format!("{{\"fence\": {mark}}}\n").into_bytes();
                self.write_in_place(path, file, text, bytes.len())?;
            }
            Ok(out)
        })();
        let _ = ofd_lock(fd, MUTATE, libc::F_UNLCK as libc::c_int, false);
        res
    }
}

/// The fence a mark file's bytes hold: `None` when there is none.
fn read_mark(bytes: &[u8]) -> Option<u64> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Some(0);
    }
    decide::salvage_fence(bytes)
}

enum Step<T> {
    Done(T),
    Unlinked,
}

/// The most a record file is read of: a longer one reads as corrupt.
const READ_LIMIT: usize = 1 << 20;

/// The most bytes of holder id and labels a lease may carry ([`AcquireRequest::check_size`]): a
/// record holds them, a waiter's id of the same bound and a few hundred bytes more, far within
/// the 1 MiB a record file is read up to.
pub const LABEL_LIMIT: usize = 256 << 10;

fn read_record(file: &File) -> io::Result<(Found, usize)> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        // Under the mutation lock nobody writes: a short read is the end of the file.
        if n == 0 || len < buf.len() || len >= READ_LIMIT {
            break;
        }
        buf.resize(len * 2, 0);
    }
    let bytes = &buf[..len];
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok((Found::Missing, len));
    }
    let found = match serde_json::from_slice::<LeaseRecord>(bytes) {
        Ok(r) => Found::Record(r),
        Err(e) => Found::Corrupt {
            detail: e.to_string(),
            salvaged: decide::salvage_fence(bytes),
        },
    };
    Ok((found, len))
}

impl FileStore {
    /// Opens (creating if missing) the store directory `dir`, its parents too. An existing
    /// directory is used as it is (its mode is not changed).
    ///
    /// # Errors
    /// [`Error::Io`] when the directory cannot be created or is not a directory;
    /// [`Error::InvalidOption`] for a mode without owner read/write (or above 0777).
    ///
    /// ```
    /// use leasehold::{stores::file::FileStore, Error};
    /// let tmp = tempfile::tempdir().unwrap();
    /// let store = FileStore::open(tmp.path().join("a/b/locks"), Default::default())?;
    /// assert!(store.dir().is_dir());
    /// let plain = tmp.path().join("plain-file");
    /// std::fs::write(&plain, "").unwrap();
    /// assert!(matches!(FileStore::open(&plain, Default::default()), Err(Error::Io { .. })));
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn open(dir: impl AsRef<Path>, opts: FileOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let dir_mode = crate::fsmode::dir_mode_for(opts.mode)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(dir_mode)
            .create(&dir)
            .map_err(|e| Error::io("create directory", dir.display(), e))?;
        let meta = std::fs::metadata(&dir).map_err(|e| Error::io("stat", dir.display(), e))?;
        if !meta.is_dir() {
            return Err(Error::io(
                "open store",
                dir.display(),
                io::Error::other("not a directory"),
            ));
        }
        Ok(FileStore {
            inner: Arc::new(Inner {
                dir,
                opts,
                naming: Naming::file(),
                held: Mutex::new(HashMap::new()),
                notifier: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Opens the directory a `file:///path/to/dir[?mode=0640&fsync=true]` URL names, with the
    /// options of its query ([`FileOptions`]).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL that names no local directory or has a bad or unknown
    /// parameter; then as [`open`](Self::open).
    ///
    /// ```
    /// use leasehold::stores::file::FileStore;
    /// let dir = tempfile::tempdir().unwrap();
    /// let url = format!("file://{}?mode=0640", dir.path().display());
    /// let store = FileStore::from_url(&url)?;
    /// assert_eq!(store.dir(), dir.path());
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let FileUrl { dir, options } = crate::store::StoreOptions::from_url(url)?;
        Self::open(dir, options)
    }

    /// The store directory, as given to [`open`](Self::open) (see there for an example).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The path of `key`'s record file: `<dir>/<name>.lease`, the name from [`Naming::file`]
    /// (any key maps to a file directly in the directory). The file stays after a release: it
    /// keeps the key's fence.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use leasehold::{stores::file::FileStore, HolderId, Key, Locks};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = FileStore::open(dir.path(), Default::default())?;
    /// let path = store.record_path(&Key::new("../user:alice")?);
    /// assert_eq!(path.parent(), Some(dir.path()));
    /// let locks = Locks::new(store).with_holder(HolderId::new("web-1"));
    /// locks.lock("../user:alice")?.acquire().await?.release().await?;
    /// let json = std::fs::read_to_string(&path).unwrap();
    /// assert!(json.contains(r#""key": "../user:alice""#), "{json}");
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    pub fn record_path(&self, key: &Key) -> PathBuf {
        self.inner.path(key)
    }

    /// Runs `op` without blocking on the mutation lock; if it is busy, runs it on the blocking pool
    /// where it waits for the lock.
    async fn run<T: Send + 'static>(
        &self,
        op: impl Fn(&Inner, bool) -> Result<Option<T>> + Send + 'static,
    ) -> Result<T> {
        if let Some(t) = op(&self.inner, false)? {
            return Ok(t);
        }
        let inner = self.inner.clone();
        let store = self.inner.describe();
        match tokio::task::spawn_blocking(move || op(&inner, true)).await {
            Ok(Ok(Some(t))) => Ok(t),
            Ok(Ok(None)) => Err(Error::Store {
                source: None,
                store,
                detail: "mutation lock not obtained".into(),
                retryable: true,
            }),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(Error::Store {
                source: None,
                store,
                detail: format!("blocking task failed: {e}"),
                retryable: true,
            }),
        }
    }
}

#[async_trait]
impl LockStore for FileStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn floor(&self) -> Option<Arc<dyn crate::floor::Floor>> {
        Some(Arc::new(floor::FileFloor(self.inner.clone())))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: false,
            watch: true,
            liveness: true,
            fence_source: "max(previous + 1, µs clock), kept in the record file",
            waiter_line: true,
            release_grants: true,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::Host,
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        req.check_size(LABEL_LIMIT, &self.describe())?;
        let req = req.clone();
        self.run(move |inner, wait| inner.acquire(&req, wait)).await
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        let (key, token) = (key.clone(), token.to_owned());
        self.run(move |inner, wait| inner.renew(&key, &token, ttl, wait))
            .await
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        let (key, token) = (key.clone(), token.to_owned());
        self.run(move |inner, wait| inner.release(&key, &token, wait))
            .await
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        let (key, token) = (key.clone(), token.to_owned());
        self.run(move |inner, wait| {
            inner.simple(&key, wait, (), |found| {
                let rules = Rules::clock(Now::wall());
                ((), decide::withdraw_waiter(found.record(), &token, &rules))
            })
        })
        .await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        let inner = self.inner.clone();
        let key = key.clone();
        blocking(&self.inner, move || {
            let path = inner.path(&key);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok(inner
                .read_shared(&path)?
                .and_then(|f| inner.inspection(name, f)))
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        let inner = self.inner.clone();
        let prefix = prefix.to_owned();
        blocking(&self.inner, move || inner.list(&prefix)).await
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        let key = key.clone();
        self.run(move |inner, wait| {
            inner.simple(&key, wait, None, |found| match found.record() {
                Some(r) => (
                    Some(r.clone()),
                    decide::force_freed(r, None, now_ms(), decide::Expiry::Clock),
                ),
                None => (None, None),
            })
        })
        .await
    }

    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        let (key, holder) = (key.clone(), holder.to_owned());
        self.run(move |inner, wait| {
            inner.simple(&key, wait, None, |found| {
                let cur = found.record();
                let write = cur.and_then(|r| {
                    decide::force_freed(r, Some(&holder), now_ms(), decide::Expiry::Clock)
                });
                (write.as_ref().and(cur.cloned()), write)
            })
        })
        .await
    }

    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        let (inner, progress) = (self.inner.clone(), progress.clone());
        blocking(&self.inner, move || inner.cleanup(older_than, &progress)).await
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        let path = self.inner.path(key);
        // The file must exist to be watched; creating an empty one is what acquire does anyway.
        drop(self.inner.open(&path, true)?);
        let notifier = self
            .inner
            .notifier
            .get_or_init(|| Notifier::start().map_err(|e| e.to_string()))
            .clone()
            .map_err(|e| Error::io("inotify", path.display(), io::Error::other(e)))?;
        let watch = notifier
            .watch(&path)
            .map_err(|e| Error::io("inotify", path.display(), e))?;
        Ok(Some(Box::new(watch)))
    }
}

async fn blocking<T: Send + 'static>(
    inner: &Inner,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let store = inner.describe();
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Store {
            source: None,
            store,
            detail: format!("blocking task failed: {e}"),
            retryable: true,
        })?
}
