//! Expiry on the host's boot-time clock. Every process of a host reads the same `CLOCK_BOOTTIME`
//! (time since boot, suspend included), which neither NTP nor a person setting the date moves;
//! `/proc/sys/kernel/random/boot_id` tells boots apart. A record keeps its wall-clock `expires`
//! (for people, and for records written before or in another boot) and, beside it in its `store`
//! entries, the boot id and the same deadlines on the boot-time clock. Before a decision the
//! record's deadlines are translated into this process's wall clock *from the boot-time stamps*
//! ([`view`]), so the decision's comparisons with the wall clock measure the boot-time clock's
//! remaining time; after it, the deadlines it wrote are stamped ([`stamp`]).

use crate::record::LeaseRecord;
use std::sync::OnceLock;

const BOOT_ID: &str = "boot_id";
const EXPIRES: &str = "expires_boottime_ms";
const WAITER_EXPIRES: &str = "waiter_expires_boottime_ms";
/// The prefix of each permit's stamp, followed by its token.
const PERMIT_EXPIRES: &str = "permit_expires_boottime_ms/";

/// One reading of both clocks, and this boot's id.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clocks {
    wall_ms: u64,
    boot_ms: u64,
    boot_id: &'static str,
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
        boot_id: boot_id()?,
        boot_ms: boottime_ms()?,
        wall_ms: crate::record::now_ms(),
    })
}

fn stamped(r: &LeaseRecord, name: &str) -> Option<u64> {
    r.store.get(name).and_then(|v| v.parse().ok())
}

impl Clocks {
    /// The wall-clock time (on this process's clock now) of the boot-time instant `boot_ms`.
    fn to_wall(self, boot_ms: u64) -> u64 {
        if boot_ms >= self.boot_ms {
            self.wall_ms.saturating_add(boot_ms - self.boot_ms)
        } else {
            self.wall_ms.saturating_sub(self.boot_ms - boot_ms)
        }
    }

    /// The boot-time instant of the wall-clock time `wall_ms` (on this process's clock now).
    fn to_boot(self, wall_ms: u64) -> u64 {
        if wall_ms >= self.wall_ms {
            self.boot_ms.saturating_add(wall_ms - self.wall_ms)
        } else {
            self.boot_ms.saturating_sub(self.wall_ms - wall_ms)
        }
    }

    fn this_boot(self, r: &LeaseRecord) -> bool {
        r.store.get(BOOT_ID).map(String::as_str) == Some(self.boot_id)
    }
}

/// Translates the deadlines of a record stamped in this boot into this process's wall clock, from
/// their boot-time stamps; a record of another boot, or without stamps, is left as written.
pub(super) fn view(r: &mut LeaseRecord, c: Clocks) {
    if !c.this_boot(r) {
        return;
    }
    if let (Some(_), Some(e)) = (&r.token, stamped(r, EXPIRES)) {
        r.expires_ms = c.to_wall(e);
    }
    if let (Some(_), Some(e)) = (&r.waiter_token, stamped(r, WAITER_EXPIRES)) {
        r.waiter_expires_ms = Some(c.to_wall(e));
    }
    let stamps = r.store.clone();
    for p in r.permits.iter_mut().flat_map(|t| t.holders.iter_mut()) {
        let name = format!("{PERMIT_EXPIRES}{}", p.token);
        if let Some(e) = stamps.get(&name).and_then(|v| v.parse().ok()) {
            p.expires_ms = c.to_wall(e);
        }
    }
}

/// Stamps the deadlines of `w`, about to be written after a decision on `seen` (as [`view`]
/// made it): a deadline the decision left as it was keeps its stamp, one it set (a grant, a
/// renewal, a waiter registration) is stamped from this reading of both clocks.
pub(super) fn stamp(w: &mut LeaseRecord, seen: Option<&LeaseRecord>, c: Clocks) {
    let seen = seen.filter(|s| c.this_boot(s));
    let keep = |name: &str, same: bool| same.then(|| seen.and_then(|s| stamped(s, name))).flatten();
    let expires = w.token.as_ref().map(|t| {
        let same =
            seen.is_some_and(|s| s.token.as_ref() == Some(t) && s.expires_ms == w.expires_ms);
        keep(EXPIRES, same).unwrap_or_else(|| c.to_boot(w.expires_ms))
    });
    let waiter = match (&w.waiter_token, w.waiter_expires_ms) {
        (Some(t), Some(e)) => {
            let same = seen.is_some_and(|s| {
                s.waiter_token.as_ref() == Some(t) && s.waiter_expires_ms == Some(e)
            });
            Some(keep(WAITER_EXPIRES, same).unwrap_or_else(|| c.to_boot(e)))
        }
        _ => None,
    };
    // Each permit's deadline, as the holder's.
    let permits: Vec<(String, u64)> = w
        .permits
        .iter()
        .flat_map(|t| &t.holders)
        .map(|p| {
            let name = format!("{PERMIT_EXPIRES}{}", p.token);
            let same = seen.is_some_and(|s| {
                s.permits
                    .iter()
                    .flat_map(|t| &t.holders)
                    .any(|q| q.token == p.token && q.expires_ms == p.expires_ms)
            });
            let v = keep(&name, same).unwrap_or_else(|| c.to_boot(p.expires_ms));
            (name, v)
        })
        .collect();
    w.store.retain(|k, _| !k.starts_with(PERMIT_EXPIRES));
    for (name, v) in permits {
        w.store.insert(name, v.to_string());
    }
    w.store.insert(BOOT_ID.into(), c.boot_id.into());
    for (name, v) in [(EXPIRES, expires), (WAITER_EXPIRES, waiter)] {
        match v {
            Some(v) => w.store.insert(name.into(), v.to_string()),
            None => w.store.remove(name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_step_does_not_move_a_permits_deadline() {
        use crate::record::{PermitKind, Permits};
        let c = Clocks {
            wall_ms: 1_000_000,
            boot_ms: 5_000,
            boot_id: "b1",
        };
        let mut r = LeaseRecord::free("k", 1);
        let mut table = Permits::new(PermitKind::Semaphore { permits: 2 });
        let permit: crate::record::Permit = serde_json::from_value(serde_json::json!({
            "holder": "a", "token": "t", "fence": 2, "acquired": 1_000_000u64,
            "renewed": 1_000_000u64, "expires": 1_010_000u64, "ttl_ms": 10_000,
        }))
        .unwrap();
        table.holders.push(permit);
        r.permits = Some(table);
        stamp(&mut r, None, c);
        assert_eq!(r.store["permit_expires_boottime_ms/t"], "15000");
        // One second later on the boot-time clock, the wall clock set 60 s ahead: nine seconds
        // are left on the wall clock too.
        let later = Clocks {
            wall_ms: 1_061_000,
            boot_ms: 6_000,
            boot_id: "b1",
        };
        let mut seen = r.clone();
        view(&mut seen, later);
        let expires = |r: &LeaseRecord| r.permits.as_ref().unwrap().holders[0].expires_ms;
        assert_eq!(expires(&seen), 1_070_000);
        let mut w = seen.clone();
        stamp(&mut w, Some(&seen), later);
        assert_eq!(w.store["permit_expires_boottime_ms/t"], "15000");
        // Released: its stamp goes with it.
        w.permits.as_mut().unwrap().holders.clear();
        stamp(&mut w, Some(&seen), later);
        assert!(!w.store.contains_key("permit_expires_boottime_ms/t"));
    }

    #[test]
    fn a_wall_clock_step_does_not_move_a_stamped_deadline() {
        let c = Clocks {
            wall_ms: 1_000_000,
            boot_ms: 5_000,
            boot_id: "b1",
        };
        let mut r = LeaseRecord::free("k", 1);
        r.token = Some("t".into());
        r.expires_ms = 1_010_000;
        stamp(&mut r, None, c);
        assert_eq!(r.store[EXPIRES], "15000");
        // One second later on the boot-time clock, the wall clock set 60 s ahead.
        let later = Clocks {
            wall_ms: 1_061_000,
            boot_ms: 6_000,
            boot_id: "b1",
        };
        let mut seen = r.clone();
        view(&mut seen, later);
        assert_eq!(
            seen.expires_ms, 1_070_000,
            "nine seconds left on the wall clock too"
        );
        // A decision that leaves the deadline alone keeps its stamp.
        let mut w = seen.clone();
        stamp(&mut w, Some(&seen), later);
        assert_eq!(w.store[EXPIRES], "15000");
        // Another boot: as written.
        let other = Clocks {
            boot_id: "b2",
            ..later
        };
        let mut as_written = r.clone();
        view(&mut as_written, other);
        assert_eq!(as_written.expires_ms, 1_010_000);
    }
}
