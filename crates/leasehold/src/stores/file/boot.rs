//! Expiry on the host's boot-time clock. Every process of a host reads the same `CLOCK_BOOTTIME`
//! (time since boot, suspend included), which neither NTP nor a person setting the date moves;
//! `/proc/sys/kernel/random/boot_id` tells boots apart. A process in a Linux time namespace
//! (`unshare --time`, a container restored by CRIU) reads that clock shifted by its namespace's
//! offset, which `/proc/self/timens_offsets` shows: the offset is taken off every reading, so all
//! processes of a boot judge on the host's clock ([`now`]). A process that cannot tell its
//! offset (it left its time namespace without an `exec`, or the file cannot be read) is refused.
//!
//! A record keeps its wall-clock deadlines (`expires`, `waiter_expires`, each queued place's and
//! each permit's `expires`: for people, and for records written before or in another boot) and,
//! beside them in its `store` entries, the boot id and the same deadlines on the host's boot-time
//! clock. Before a decision the record's deadlines are translated into this process's wall clock
//! *from the boot-time stamps* ([`view`]), so the decision's comparisons with the wall clock
//! measure the boot-time clock's remaining time; after it, the deadlines it set are stamped, and
//! the ones it left alone keep their stamps and their wall-clock times as their writers wrote
//! them ([`stamp`]), so a process whose wall clock is off writes its error into its own entries
//! only.

use crate::record::LeaseRecord;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

const BOOT_ID: &str = "boot_id";
const EXPIRES: &str = "expires_boottime_ms";
const WAITER_EXPIRES: &str = "waiter_expires_boottime_ms";
/// The prefix of each queued place's stamp, followed by its token.
const QUEUE_EXPIRES: &str = "queue_expires_boottime_ms/";
/// The prefix of each permit's stamp, followed by its token.
const PERMIT_EXPIRES: &str = "permit_expires_boottime_ms/";

/// One reading of both clocks (the boot-time one as the host's), and this boot's id.
#[derive(Debug, Clone)]
pub(super) struct Clocks {
    wall_ms: u64,
    boot_ms: u64,
    boot_id: String,
}

/// The files of `/proc` a reading of the clocks looks at, kept open: reading an open one again
/// costs a microsecond, opening one ten.
#[derive(Debug)]
struct Proc {
    /// The process they were opened by (a child forked without an `exec` opens its own).
    pid: u32,
    /// `/proc/sys/kernel/random/boot_id`; `None` where the kernel does not say (not Linux, no
    /// `/proc`).
    boot_id: Option<File>,
    /// `/proc/self/timens_offsets`; `None` on a kernel without time namespaces.
    offsets: Option<File>,
    /// The text of `offsets` when this process's offset was last read from it, and that offset:
    /// it holds while the text is the same (see [`Proc::offset_ns`]).
    checked: Option<(Vec<u8>, i128)>,
}

/// The `/proc` files of this process, opened on first use.
static PROC: Mutex<Option<Proc>> = Mutex::new(None);

/// Reads all of `file` from its start (a `/proc` file is made at each read).
fn read_all(file: &File) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let mut len = 0;
    loop {
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        if n == 0 {
            buf.truncate(len);
            return Ok(buf);
        }
        if len == buf.len() {
            if len >= 64 << 10 {
                return Err(std::io::Error::other("longer than 64 KiB"));
            }
            buf.resize(len * 2, 0);
        }
    }
}

impl Proc {
    fn open(pid: u32) -> Result<Proc, String> {
        let open = |path: &str| match File::open(path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot open {path}: {e}")),
        };
        let boot_id = open("/proc/sys/kernel/random/boot_id")?;
        let offsets = open("/proc/self/timens_offsets")?;
        if offsets.is_none() && boot_id.is_some() && namespace("time")?.is_some() {
            return Err("this kernel has time namespaces but no /proc/self/timens_offsets".into());
        }
        Ok(Proc {
            pid,
            boot_id,
            offsets,
            checked: None,
        })
    }

    /// This boot's id, read now; `None` where the kernel does not say.
    fn boot_id(&self) -> Result<Option<String>, String> {
        let Some(f) = &self.boot_id else {
            return Ok(None);
        };
        let bytes = read_all(f).map_err(|e| format!("cannot read the boot id: {e}"))?;
        let id = String::from_utf8_lossy(&bytes).trim().to_owned();
        Ok((!id.is_empty()).then_some(id))
    }

    /// How far this process's `CLOCK_BOOTTIME` is ahead of the host's, in nanoseconds: its time
    /// namespace's boot-time offset (0 on a kernel without time namespaces).
    ///
    /// `/proc/self/timens_offsets` shows the offsets of the namespace this process's *children*
    /// get, which is its own unless it called `unshare(CLONE_NEWTIME)` without an `exec` since:
    /// then the two differ and its own offset cannot be read. So the offset is taken from it only
    /// when both namespaces are one, and kept while the file says the same: a namespace's
    /// offsets cannot change once a process is in it, and a namespace this process unshares for
    /// its children starts with the same offsets (a write that changes them changes the text,
    /// and then the namespaces are compared again).
    fn offset_ns(&mut self) -> Result<i128, String> {
        let Some(f) = &self.offsets else {
            return Ok(0);
        };
        let text =
            read_all(f).map_err(|e| format!("cannot read /proc/self/timens_offsets: {e}"))?;
        if let Some((seen, offset)) = &self.checked {
            if *seen == text {
                return Ok(*offset);
            }
        }
        self.checked = None;
        let (own, children) = (namespace("time")?, namespace("time_for_children")?);
        if own != children {
            return Err(format!(
                "this process's time namespace ({own:?}) is not the one /proc/self/timens_offsets \
                 describes ({children:?}): it left its namespace without an exec"
            ));
        }
        let text_str = String::from_utf8_lossy(&text);
        let offset = parse_boottime_offset(&text_str).ok_or_else(|| {
            format!("no boot-time offset in /proc/self/timens_offsets: {text_str:?}")
        })?;
        self.checked = Some((text, offset));
        Ok(offset)
    }
}

/// The namespace `/proc/self/ns/NAME` links to; `None` when there is no such link.
fn namespace(name: &str) -> Result<Option<std::path::PathBuf>, String> {
    match std::fs::read_link(format!("/proc/self/ns/{name}")) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read /proc/self/ns/{name}: {e}")),
    }
}

/// `CLOCK_BOOTTIME` of this process's time namespace, in nanoseconds, asked of the kernel by the
/// system call itself: a library preloaded to fake the clocks (libfaketime, which without
/// `FAKETIME_DONT_FAKE_MONOTONIC` makes `clock_gettime(CLOCK_BOOTTIME)` read its faked wall
/// clock) replaces the C library's `clock_gettime`, not the kernel's answer, which is the one
/// every process of the host shares.
fn boottime_ns() -> Option<i128> {
    // SAFETY: an all-zero timespec is valid; the kernel fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime(2) with a clock id and a valid out-pointer, the arguments it takes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clock_gettime,
            libc::CLOCK_BOOTTIME,
            std::ptr::addr_of_mut!(ts),
        )
    };
    if rc != 0 {
        return None;
    }
    Some(i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec))
}

/// The boot-time line of `/proc/PID/timens_offsets` (`boottime SECS NANOS`; the clock's number,
/// 7, on the first kernels with time namespaces), in nanoseconds.
fn parse_boottime_offset(text: &str) -> Option<i128> {
    text.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let clock = f.next()?;
        if clock != "boottime" && clock != libc::CLOCK_BOOTTIME.to_string() {
            return None;
        }
        let secs: i64 = f.next()?.parse().ok()?;
        let nanos: u32 = f.next()?.parse().ok()?;
        (nanos < 1_000_000_000 && f.next().is_none())
            .then(|| i128::from(secs) * 1_000_000_000 + i128::from(nanos))
    })
}

/// Both clocks now, the boot-time one as the host's (this process's less its time namespace's
/// offset), and the boot id, all read afresh (a process restored by CRIU may run in another
/// namespace or boot than it started in). `Ok(None)` without a boot-time clock or boot id (the
/// wall clock alone judges); an error when this process's clock cannot be placed on the host's:
/// it must not judge leases then, since its boot-time clock may be shifted by any amount.
pub(super) fn now() -> Result<Option<Clocks>, String> {
    let mut proc = PROC.lock();
    let pid = std::process::id();
    if proc.as_ref().map(|p| p.pid) != Some(pid) {
        *proc = Some(Proc::open(pid)?);
    }
    let Some(p) = proc.as_mut() else {
        return Err("no /proc files".into());
    };
    let Some(boot_id) = p.boot_id()? else {
        return Ok(None);
    };
    let offset = p.offset_ns()?;
    let Some(boot) = boottime_ns() else {
        return Ok(None);
    };
    let host = boot - offset;
    let boot_ms = u64::try_from(host / 1_000_000).map_err(|_| {
        format!("CLOCK_BOOTTIME less its time namespace's offset is negative ({host} ns)")
    })?;
    Ok(Some(Clocks {
        wall_ms: crate::record::now_ms(),
        boot_ms,
        boot_id,
    }))
}

fn stamped(r: &LeaseRecord, name: &str) -> Option<u64> {
    r.store.get(name).and_then(|v| v.parse().ok())
}

impl Clocks {
    /// The wall-clock time (on this process's clock now) of the boot-time instant `boot_ms`.
    fn to_wall(&self, boot_ms: u64) -> u64 {
        if boot_ms >= self.boot_ms {
            self.wall_ms.saturating_add(boot_ms - self.boot_ms)
        } else {
            self.wall_ms.saturating_sub(self.boot_ms - boot_ms)
        }
    }

    /// The boot-time instant of the wall-clock time `wall_ms` (on this process's clock now).
    fn to_boot(&self, wall_ms: u64) -> u64 {
        if wall_ms >= self.wall_ms {
            self.boot_ms.saturating_add(wall_ms - self.wall_ms)
        } else {
            self.boot_ms.saturating_sub(self.wall_ms - wall_ms)
        }
    }

    fn this_boot(&self, r: &LeaseRecord) -> bool {
        r.store.get(BOOT_ID) == Some(&self.boot_id)
    }
}

/// Which deadline of a record: the lease's, a place in line (the registered waiter's or a queued
/// one's: a place keeps its token as it moves up), or a permit's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Lease,
    Line,
    Permit,
}

/// Calls `f` on each deadline of `r`: its kind, its token, its wall-clock time, the name of its
/// boot-time stamp.
fn each_deadline(r: &mut LeaseRecord, mut f: impl FnMut(Kind, &str, &mut u64, String)) {
    if let Some(t) = &r.token {
        f(Kind::Lease, t, &mut r.expires_ms, EXPIRES.into());
    }
    if let (Some(t), Some(e)) = (&r.waiter_token, r.waiter_expires_ms.as_mut()) {
        f(Kind::Line, t, e, WAITER_EXPIRES.into());
    }
    for w in &mut r.queue {
        let name = format!("{QUEUE_EXPIRES}{}", w.token);
        f(Kind::Line, &w.token, &mut w.expires_ms, name);
    }
    for p in r.permits.iter_mut().flat_map(|t| t.holders.iter_mut()) {
        let name = format!("{PERMIT_EXPIRES}{}", p.token);
        f(Kind::Permit, &p.token, &mut p.expires_ms, name);
    }
}

/// Each deadline of `r` by kind and token: its wall-clock time and the name of its stamp.
fn deadlines(r: &LeaseRecord) -> BTreeMap<(Kind, String), (u64, String)> {
    let mut out = BTreeMap::new();
    each_deadline(&mut r.clone(), |kind, token, v, name| {
        out.insert((kind, token.to_owned()), (*v, name));
    });
    out
}

/// Whether `name` is a boot-time entry of a record's `store`.
fn is_boot_entry(name: &str) -> bool {
    [BOOT_ID, EXPIRES, WAITER_EXPIRES].contains(&name)
        || name.starts_with(QUEUE_EXPIRES)
        || name.starts_with(PERMIT_EXPIRES)
}

/// Translates the deadlines of a record stamped in this boot into this process's wall clock, from
/// their boot-time stamps; a record of another boot, or a deadline without a stamp, is left as
/// written.
pub(super) fn view(r: &mut LeaseRecord, c: &Clocks) {
    if !c.this_boot(r) {
        return;
    }
    let stamps = std::mem::take(&mut r.store);
    each_deadline(r, |_, _, v, name| {
        if let Some(e) = stamps.get(&name).and_then(|s| s.parse().ok()) {
            *v = c.to_wall(e);
        }
    });
    r.store = stamps;
}

/// Stamps the deadlines of `w`, about to be written after a decision on `seen` (`raw` as read,
/// `seen` as [`view`] made it): a deadline the decision left as it was keeps its stamp and its
/// wall-clock time as `raw` has them (its writer's); one it set (a grant, a renewal, a place in
/// line taken or renewed) is stamped from this reading of both clocks, or, without one
/// (`c` is `None`: no boot-time clock), left without a stamp.
pub(super) fn stamp(
    w: &mut LeaseRecord,
    raw: Option<&LeaseRecord>,
    seen: Option<&LeaseRecord>,
    c: Option<&Clocks>,
) {
    let seen = seen.map(deadlines).unwrap_or_default();
    let written = raw.map(deadlines).unwrap_or_default();
    // The stamps of `raw` hold where it is of this boot (or, with no clock of our own, of any).
    let raw_boot = raw.and_then(|r| r.store.get(BOOT_ID));
    let stamps = raw.filter(|r| c.map_or(raw_boot.is_some(), |c| c.this_boot(r)));
    let mut out: Vec<(String, u64)> = Vec::new();
    each_deadline(w, |kind, token, v, name| {
        let key = (kind, token.to_owned());
        let unchanged = seen.get(&key).is_some_and(|(s, _)| s == v);
        if let (true, Some((as_written, old))) = (unchanged, written.get(&key)) {
            *v = *as_written;
            if let Some(s) = stamps.and_then(|r| stamped(r, old)) {
                out.push((name, s));
                return;
            }
        }
        if let Some(c) = c {
            out.push((name, c.to_boot(*v)));
        }
    });
    w.store.retain(|k, _| !is_boot_entry(k));
    let id = match c {
        Some(c) => Some(c.boot_id.clone()),
        None => raw_boot.filter(|_| !out.is_empty()).cloned(),
    };
    if let Some(id) = id {
        w.store.insert(BOOT_ID.into(), id);
    }
    for (name, v) in out {
        w.store.insert(name, v.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clocks(wall_ms: u64, boot_ms: u64, boot_id: &str) -> Clocks {
        Clocks {
            wall_ms,
            boot_ms,
            boot_id: boot_id.into(),
        }
    }

    /// `r` written by a process reading `c`: stamped as a decision on nothing would be.
    fn written(mut r: LeaseRecord, c: &Clocks) -> LeaseRecord {
        stamp(&mut r, None, None, Some(c));
        r
    }

    /// A decision of a process reading `c` on `raw` that changes nothing but what `decide` does:
    /// the record it writes.
    fn decided(
        raw: &LeaseRecord,
        c: &Clocks,
        decide: impl FnOnce(&mut LeaseRecord),
    ) -> LeaseRecord {
        let mut seen = raw.clone();
        view(&mut seen, c);
        let mut w = seen.clone();
        decide(&mut w);
        stamp(&mut w, Some(raw), Some(&seen), Some(c));
        w
    }

    #[test]
    fn a_wall_clock_step_does_not_move_a_permits_deadline() {
        use crate::record::{PermitKind, Permits};
        let c = clocks(1_000_000, 5_000, "b1");
        let mut r = LeaseRecord::free("k", 1);
        let mut table = Permits::new(PermitKind::Semaphore { permits: 2 });
        let permit: crate::record::Permit = serde_json::from_value(serde_json::json!({
            "holder": "a", "token": "t", "fence": 2, "acquired": 1_000_000u64,
            "renewed": 1_000_000u64, "expires": 1_010_000u64, "ttl_ms": 10_000,
        }))
        .unwrap();
        table.holders.push(permit);
        r.permits = Some(table);
        let r = written(r, &c);
        assert_eq!(r.store["permit_expires_boottime_ms/t"], "15000");
        // One second later on the boot-time clock, the wall clock set 60 s ahead: nine seconds
        // are left on the wall clock too.
        let later = clocks(1_061_000, 6_000, "b1");
        let mut seen = r.clone();
        view(&mut seen, &later);
        let expires = |r: &LeaseRecord| r.permits.as_ref().unwrap().holders[0].expires_ms;
        assert_eq!(expires(&seen), 1_070_000);
        let w = decided(&r, &later, |_| {});
        assert_eq!(w.store["permit_expires_boottime_ms/t"], "15000");
        assert_eq!(expires(&w), 1_010_000, "as its holder wrote it");
        // Released: its stamp goes with it.
        let w = decided(&r, &later, |w| w.permits.as_mut().unwrap().holders.clear());
        assert!(!w.store.contains_key("permit_expires_boottime_ms/t"));
    }

    #[test]
    fn a_wall_clock_step_does_not_move_a_stamped_deadline() {
        let c = clocks(1_000_000, 5_000, "b1");
        let mut r = LeaseRecord::free("k", 1);
        r.token = Some("t".into());
        r.expires_ms = 1_010_000;
        let r = written(r, &c);
        assert_eq!(r.store[EXPIRES], "15000");
        // One second later on the boot-time clock, the wall clock set 60 s ahead.
        let later = clocks(1_061_000, 6_000, "b1");
        let mut seen = r.clone();
        view(&mut seen, &later);
        assert_eq!(
            seen.expires_ms, 1_070_000,
            "nine seconds left on the wall clock too"
        );
        // A decision that leaves the deadline alone keeps its stamp, and its time as written.
        let w = decided(&r, &later, |_| {});
        assert_eq!(w.store[EXPIRES], "15000");
        assert_eq!(w.expires_ms, 1_010_000);
        // Another boot: as written.
        let other = clocks(1_061_000, 6_000, "b2");
        let mut as_written = r.clone();
        view(&mut as_written, &other);
        assert_eq!(as_written.expires_ms, 1_010_000);
    }

    /// A place in line is stamped like the lease: a waiter whose wall clock is an hour ahead
    /// takes a place of 5 s, which lapses 5 s later on the boot-time clock, also once it has
    /// moved up to be the registered waiter.
    #[test]
    fn a_place_in_line_lapses_on_the_boot_time_clock_whatever_its_writers_wall_clock() {
        use crate::record::QueuedWaiter;
        let host = clocks(1_000_000, 5_000, "b1");
        let ahead = clocks(1_000_000 + 3_600_000, 5_000, "b1");
        let mut r = LeaseRecord::free("k", 1);
        r.token = Some("holder".into());
        r.expires_ms = 1_030_000;
        r.waiter = Some("first".into());
        r.waiter_token = Some("w1".into());
        r.waiter_expires_ms = Some(1_005_000);
        let r = written(r, &host);
        // The waiter an hour ahead joins the line.
        let r = decided(&r, &ahead, |w| {
            w.queue.push(QueuedWaiter::new(
                "late",
                "w2",
                3_605_000 + 1_000_000,
                5_000,
            ));
        });
        assert_eq!(r.store["queue_expires_boottime_ms/w2"], "10000");
        // Its write left the others' times as they wrote them.
        assert_eq!(r.expires_ms, 1_030_000, "the lease as its holder wrote it");
        assert_eq!(r.waiter_expires_ms, Some(1_005_000));
        // The host reads it: the place lapses 5 s after it was taken, not an hour later.
        let mut seen = r.clone();
        view(&mut seen, &host);
        assert_eq!(seen.queue[0].expires_ms, 1_005_000);
        // The first waiter is granted; the place moves up with its stamp.
        let w = decided(&r, &host, |w| {
            assert!(crate::decide::leave_line(w, "w1"));
        });
        assert_eq!(w.waiter_token.as_deref(), Some("w2"));
        assert_eq!(w.store[WAITER_EXPIRES], "10000");
        assert!(!w.store.contains_key("queue_expires_boottime_ms/w2"));
        let mut seen = w.clone();
        view(&mut seen, &host);
        assert_eq!(seen.waiter_expires_ms, Some(1_005_000));
        assert!(!crate::decide::Expiry::Clock.waiter_live(&seen, 1_005_000));
    }

    /// Without a boot-time clock a decision stamps nothing it set, and keeps what it left alone.
    #[test]
    fn without_clocks_only_untouched_stamps_stay() {
        let c = clocks(1_000_000, 5_000, "b1");
        let mut r = LeaseRecord::free("k", 1);
        r.token = Some("t".into());
        r.expires_ms = 1_010_000;
        r.waiter_token = Some("w".into());
        r.waiter_expires_ms = Some(1_002_000);
        let r = written(r, &c);
        let mut w = r.clone();
        w.waiter_expires_ms = Some(1_004_000);
        stamp(&mut w, Some(&r), Some(&r), None);
        assert_eq!(w.store[EXPIRES], "15000");
        assert_eq!(w.store[BOOT_ID], "b1");
        assert!(!w.store.contains_key(WAITER_EXPIRES), "{:?}", w.store);
    }

    #[test]
    fn the_boot_time_offset_is_read_from_timens_offsets() {
        let ns = parse_boottime_offset(
            "monotonic        -100         0\nboottime         3600         5\n",
        );
        assert_eq!(ns, Some(3_600_000_000_005));
        assert_eq!(
            parse_boottime_offset("1 0 0\n7 -2 500000000\n"),
            Some(-1_500_000_000)
        );
        assert_eq!(parse_boottime_offset("monotonic 0 0\n"), None);
        assert_eq!(parse_boottime_offset("boottime x 0\n"), None);
        assert_eq!(parse_boottime_offset(""), None);
    }

    /// This process (the test runner, in the host's time namespace here or in any other) reads a
    /// host boot-time clock no further than its own.
    #[test]
    fn this_process_places_its_clock_on_the_hosts() {
        let offset = Proc::open(std::process::id()).unwrap().offset_ns().unwrap();
        let before = (boottime_ns().unwrap() - offset) / 1_000_000;
        let c = now().unwrap().unwrap();
        let after = (boottime_ns().unwrap() - offset) / 1_000_000;
        assert!(
            (before..=after).contains(&i128::from(c.boot_ms)),
            "{before} {c:?} {after}"
        );
    }
}
