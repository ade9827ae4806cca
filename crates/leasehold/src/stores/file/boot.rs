//! Expiry on the host's boot-time clock. Every process of a host reads the same `CLOCK_BOOTTIME`
//! (time since boot, suspend included), which neither NTP nor a person setting the date moves;
//! `/proc/sys/kernel/random/boot_id` tells boots apart.
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
use std::collections::BTreeMap;
use std::sync::OnceLock;

const BOOT_ID: &str = "boot_id";
const EXPIRES: &str = "expires_boottime_ms";
const WAITER_EXPIRES: &str = "waiter_expires_boottime_ms";
/// The prefix of each queued place's stamp, followed by its token.
const QUEUE_EXPIRES: &str = "queue_expires_boottime_ms/";
/// The prefix of each permit's stamp, followed by its token.
const PERMIT_EXPIRES: &str = "permit_expires_boottime_ms/";

/// One reading of both clocks, and this boot's id.
#[derive(Debug, Clone)]
pub(super) struct Clocks {
    wall_ms: u64,
    boot_ms: u64,
    boot_id: String,
}

/// This boot's id, read once; `None` where the kernel does not say (not Linux).
fn boot_id() -> Option<&'static str> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .as_deref()
}

/// `CLOCK_BOOTTIME` in milliseconds.
fn boottime_ms() -> Option<u64> {
    // SAFETY: an all-zero timespec is valid; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    Some(secs * 1000 + nanos / 1_000_000)
}

/// Both clocks now; `None` without a boot-time clock or boot id (the wall clock alone judges).
pub(super) fn now() -> Option<Clocks> {
    Some(Clocks {
        boot_id: boot_id()?.to_owned(),
        boot_ms: boottime_ms()?,
        wall_ms: crate::record::now_ms(),
    })
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
}
