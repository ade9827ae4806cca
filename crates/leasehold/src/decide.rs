//! The lock decision logic, pure: records in, decision out, the clock passed in.
//!
//! Shared by the memory store, the file store and the generic [`crate::adapter::RecordLockStore`], so
//! every store built on records follows one algorithm:
//!
//! * a lease is **held** while it has an owner token and has not expired (and, where the store can
//!   tell, its holder process is alive);
//! * a free or expired lease goes to the acquirer, **unless** a live waiter other than the acquirer
//!   is registered: then it is reserved for that waiter;
//! * every grant's fence is `max(previous fence + 1, now in microseconds)`: strictly increasing
//!   while the record exists whatever the clocks do, and still increasing after the record was
//!   deleted (cleanup) or damaged as long as the wall clock has not been set back past the last
//!   grant.

use crate::record::LeaseRecord;
use crate::store::{AcquireOutcome, AcquireRequest, LostReason, ReleaseOutcome, RenewOutcome};
use std::sync::OnceLock;

/// What a store found under a key before deciding.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Current<'a> {
    /// No record.
    Missing,
    /// A record that does not parse, with a fence recovered from its bytes if any.
    Corrupt {
        /// The salvaged fence.
        salvaged_fence: Option<u64>,
    },
    /// A sound record.
    Record(&'a LeaseRecord),
}

/// Times a decision needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    /// Unix milliseconds.
    pub ms: u64,
    /// Unix microseconds (the fence floor).
    pub us: u64,
}

impl Now {
    /// The wall clock now.
    pub(crate) fn wall() -> Self {
        let us = crate::record::now_us();
        Now { ms: us / 1000, us }
    }
}

/// This process's id, read once (a syscall saved per grant).
pub(crate) fn pid() -> u32 {
    static PID: OnceLock<u32> = OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// This host's name, read once.
pub(crate) fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(crate::holder::hostname)
}

/// Decides an acquisition. Returns the outcome and the record to write, if anything changes.
/// `holder_dead` is true when the store knows the recorded holder's process is gone.
pub(crate) fn acquire(
    current: Current<'_>,
    req: &AcquireRequest,
    now: Now,
    holder_dead: bool,
) -> (AcquireOutcome, Option<LeaseRecord>) {
    let base_fence = match current {
        Current::Missing => 0,
        Current::Corrupt { salvaged_fence } => salvaged_fence.unwrap_or(0),
        Current::Record(r) => r.fence,
    };
    if let Current::Record(r) = current {
        let held = r.is_held(now.ms) && !holder_dead;
        let reserved_for_other = !held
            && r.has_live_waiter(now.ms)
            && r.waiter_token.as_deref() != Some(req.token.as_str());
        if held || reserved_for_other {
            if let Some(wttl) = req.waiter_ttl {
                let mine = r.waiter_token.as_deref() == Some(req.token.as_str());
                let wttl_ms = wttl.as_millis() as u64;
                // A fresh registration of ours is left alone: rewriting it on every attempt would
                // wake every watcher (ourselves included) for nothing.
                let fresh = mine
                    && r.has_live_waiter(now.ms)
                    && r.waiter_expires_ms.unwrap_or(0) >= now.ms + wttl_ms * 2 / 3;
                if fresh {
                    return (AcquireOutcome::Held(r.clone()), None);
                }
                if mine || !r.has_live_waiter(now.ms) {
                    let mut w = r.clone();
                    w.waiter = Some(req.holder.clone());
                    w.waiter_token = Some(req.token.clone());
                    w.waiter_expires_ms = Some(now.ms + wttl_ms);
                    return (AcquireOutcome::Held(w.clone()), Some(w));
                }
            }
            return (AcquireOutcome::Held(r.clone()), None);
        }
    }
    let mut g = match current {
        Current::Record(r) => {
            let mut g = r.clone();
            g.store.clear();
            g
        }
        _ => LeaseRecord::free(req.key.as_str(), 0),
    };
    let fence = base_fence.saturating_add(req.fences.max(1)).max(now.us);
    grant(&mut g, req, fence, now.ms);
    if !g.has_live_waiter(now.ms) || g.waiter_token.as_deref() == Some(req.token.as_str()) {
        g.waiter = None;
        g.waiter_token = None;
        g.waiter_expires_ms = None;
    }
    (AcquireOutcome::Granted(g.clone()), Some(g))
}

/// Writes the grant of `req` with `fence` at `now_ms` into `g` (holder, token, fence, times, this
/// process, labels); the waiter fields are left as they are.
pub(crate) fn grant(g: &mut LeaseRecord, req: &AcquireRequest, fence: u64, now_ms: u64) {
    g.holder = Some(req.holder.clone());
    g.token = Some(req.token.clone());
    g.fence = fence;
    g.acquired_ms = now_ms;
    g.renewed_ms = now_ms;
    g.ttl_ms = req.ttl.as_millis() as u64;
    g.expires_ms = now_ms + g.ttl_ms;
    g.pid = Some(pid());
    g.host = Some(host().to_owned());
    g.labels = req.labels.clone();
}

/// Why a record is not (or no longer) the lease of `token`.
pub(crate) fn lost_reason(
    current: Option<&LeaseRecord>,
    token: &str,
    now_ms: u64,
) -> Option<LostReason> {
    match current {
        None => Some(LostReason::Released),
        Some(r) => match r.token.as_deref() {
            Some(t) if t == token => {
                if r.expires_ms > now_ms {
                    None
                } else {
                    Some(LostReason::Expired)
                }
            }
            Some(_) => Some(LostReason::TakenOver {
                holder: r.holder.clone().unwrap_or_default(),
            }),
            None => Some(LostReason::Released),
        },
    }
}

/// Decides a renewal: the record to write when it is still ours.
pub(crate) fn renew(
    current: Option<&LeaseRecord>,
    token: &str,
    ttl_ms: u64,
    now_ms: u64,
) -> (RenewOutcome, Option<LeaseRecord>) {
    if let Some(reason) = lost_reason(current, token, now_ms) {
        return (RenewOutcome::Lost(reason), None);
    }
    let Some(r) = current else {
        return (RenewOutcome::Lost(LostReason::Released), None);
    };
    let mut n = r.clone();
    n.renewed_ms = now_ms;
    n.ttl_ms = ttl_ms;
    n.expires_ms = now_ms + ttl_ms;
    if !n.has_live_waiter(now_ms) {
        n.waiter = None;
        n.waiter_token = None;
        n.waiter_expires_ms = None;
    }
    (RenewOutcome::Renewed(n.clone()), Some(n))
}

/// Decides a release: the free record to write (fence and live waiter kept).
/// A lease that expired but was not taken over is still cleared, and reported as not held.
pub(crate) fn release(
    current: Option<&LeaseRecord>,
    token: &str,
    now_ms: u64,
) -> (ReleaseOutcome, Option<LeaseRecord>) {
    match current {
        Some(r) if r.token.as_deref() == Some(token) => {
            let outcome = if r.expires_ms > now_ms {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            };
            (outcome, Some(freed(r, now_ms)))
        }
        _ => (ReleaseOutcome::NotHeld, None),
    }
}

/// The record `r` with its holder removed (fence, live waiter and key kept).
pub(crate) fn freed(r: &LeaseRecord, now_ms: u64) -> LeaseRecord {
    let mut f = r.clone();
    f.holder = None;
    f.token = None;
    f.expires_ms = 0;
    f.renewed_ms = now_ms;
    f.store.clear();
    if !f.has_live_waiter(now_ms) {
        f.waiter = None;
        f.waiter_token = None;
        f.waiter_expires_ms = None;
    }
    f
}

/// Decides a waiter withdrawal: the record to write if `token` was the waiter.
pub(crate) fn withdraw_waiter(current: Option<&LeaseRecord>, token: &str) -> Option<LeaseRecord> {
    match current {
        Some(r) if r.waiter_token.as_deref() == Some(token) => {
            let mut n = r.clone();
            n.waiter = None;
            n.waiter_token = None;
            n.waiter_expires_ms = None;
            Some(n)
        }
        _ => None,
    }
}

/// Whether `cleanup` may delete this record: free or expired, no live waiter, untouched for
/// `older_than_ms`.
pub(crate) fn removable(r: &LeaseRecord, now_ms: u64, older_than_ms: u64) -> bool {
    let last = r.renewed_ms.max(r.acquired_ms).max(r.expires_ms);
    !r.is_held(now_ms) && !r.has_live_waiter(now_ms) && last.saturating_add(older_than_ms) <= now_ms
}

/// Finds the largest `"fence": N` in damaged bytes.
pub(crate) fn salvage_fence(bytes: &[u8]) -> Option<u64> {
    let pat = b"\"fence\"";
    let mut best: Option<u64> = None;
    let mut i = 0;
    while i + pat.len() <= bytes.len() {
        if &bytes[i..i + pat.len()] == pat {
            let mut j = i + pat.len();
            while j < bytes.len() && (bytes[j] == b' ' || bytes[j] == b':' || bytes[j] == b'\n') {
                j += 1;
            }
            let start = j;
            while j < bytes.len() && bytes[j].is_ascii_digit() {
                j += 1;
            }
            if let Some(n) = std::str::from_utf8(&bytes[start..j])
                .ok()
                .and_then(|s| s.parse().ok())
            {
                best = Some(best.map_or(n, |b: u64| b.max(n)));
            }
            i = j;
        } else {
            i += 1;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Key;
    use std::time::Duration;

    fn req(token: &str) -> AcquireRequest {
        let mut r = AcquireRequest::new(
            Key::new("k").unwrap(),
            format!("h-{token}"),
            Duration::from_millis(1000),
        );
        r.token = token.into();
        r
    }
    fn at(ms: u64) -> Now {
        Now { ms, us: ms * 1000 }
    }
    fn granted(o: (AcquireOutcome, Option<LeaseRecord>)) -> LeaseRecord {
        match o {
            (AcquireOutcome::Granted(r), Some(w)) => {
                assert_eq!(r, w);
                r
            }
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn exclusion_expiry_and_fences() {
        let a = granted(acquire(Current::Missing, &req("a"), at(10), false));
        assert_eq!(a.fence, 10_000);
        // Held: b is refused while a's lease lives.
        let (o, w) = acquire(Current::Record(&a), &req("b"), at(500), false);
        assert!(matches!(o, AcquireOutcome::Held(_)) && w.is_none());
        // Same holder, other acquisition: refused too (no reentrancy).
        assert!(matches!(
            acquire(Current::Record(&a), &req("a2"), at(500), false).0,
            AcquireOutcome::Held(_)
        ));
        // Dead holder: taken at once.
        let b = granted(acquire(Current::Record(&a), &req("b"), at(500), true));
        assert!(b.fence > a.fence);
        // Expired: taken; the fence counts by one when the clock lags.
        let c = granted(acquire(Current::Record(&b), &req("c"), at(1500), false));
        assert!(c.fence > b.fence);
        let d = granted(acquire(Current::Record(&c), &req("d"), at(1), true));
        assert_eq!(
            d.fence,
            c.fence + 1,
            "a clock set back never makes the fence go backwards"
        );
        // Corrupt record: the salvaged fence is respected.
        let e = granted(acquire(
            Current::Corrupt {
                salvaged_fence: Some(u64::MAX - 1),
            },
            &req("e"),
            at(1),
            false,
        ));
        assert_eq!(e.fence, u64::MAX);
    }

    #[test]
    fn renew_and_release_are_owner_only() {
        let a = granted(acquire(Current::Missing, &req("a"), at(10), false));
        assert!(matches!(
            renew(Some(&a), "b", 1000, 20).0,
            RenewOutcome::Lost(LostReason::TakenOver { .. })
        ));
        assert!(matches!(
            renew(Some(&a), "a", 1000, 2000).0,
            RenewOutcome::Lost(LostReason::Expired)
        ));
        let (o, w) = renew(Some(&a), "a", 1000, 500);
        assert!(matches!(o, RenewOutcome::Renewed(_)));
        assert_eq!(w.unwrap().expires_ms, 1500);
        assert_eq!(release(Some(&a), "b", 20), (ReleaseOutcome::NotHeld, None));
        let (o, free) = release(Some(&a), "a", 20);
        assert_eq!(o, ReleaseOutcome::Released);
        let free = free.unwrap();
        assert_eq!(free.fence, a.fence);
        assert!(!free.is_held(20));
        assert_eq!(
            release(Some(&free), "a", 21),
            (ReleaseOutcome::NotHeld, None)
        );
        assert!(matches!(
            renew(Some(&free), "a", 1000, 21).0,
            RenewOutcome::Lost(LostReason::Released)
        ));
    }

    #[test]
    fn waiter_gets_the_lease_next() {
        let a = granted(acquire(Current::Missing, &req("a"), at(10), false));
        let mut w = req("w");
        w.waiter_ttl = Some(Duration::from_millis(300));
        let (_, reg) = acquire(Current::Record(&a), &w, at(20), false);
        let reg = reg.unwrap();
        assert_eq!(reg.waiter_token.as_deref(), Some("w"));
        // Re-attempts do not rewrite a fresh registration, and refresh an aging one.
        assert!(acquire(Current::Record(&reg), &w, at(100), false)
            .1
            .is_none());
        let refreshed = acquire(Current::Record(&reg), &w, at(150), false)
            .1
            .unwrap();
        assert_eq!(refreshed.waiter_expires_ms, Some(450));
        // A second waiter does not replace a live one.
        let mut x = req("x");
        x.waiter_ttl = Some(Duration::from_millis(300));
        assert!(acquire(Current::Record(&reg), &x, at(30), false)
            .1
            .is_none());
        // Renewal sees the waiter; release keeps it.
        let (RenewOutcome::Renewed(ren), _) = renew(Some(&reg), "a", 1000, 40) else {
            panic!()
        };
        assert!(ren.has_live_waiter(40));
        let (_, free) = release(Some(&ren), "a", 50);
        let free = free.unwrap();
        // A third party arriving now is refused; the waiter gets it.
        assert!(matches!(
            acquire(Current::Record(&free), &req("z"), at(60), false).0,
            AcquireOutcome::Held(_)
        ));
        let got = granted(acquire(Current::Record(&free), &w, at(60), false));
        assert!(got.waiter_token.is_none());
        // An expired waiter no longer reserves anything.
        let (_, free2) = release(Some(&got), "w", 70);
        let mut stale = free2.unwrap();
        stale.waiter_token = Some("gone".into());
        stale.waiter_expires_ms = Some(80);
        granted(acquire(Current::Record(&stale), &req("z"), at(90), false));
        assert!(withdraw_waiter(Some(&reg), "w").unwrap().waiter.is_none());
        assert!(withdraw_waiter(Some(&reg), "x").is_none());
    }

    #[test]
    fn salvage_finds_the_largest_fence() {
        assert_eq!(
            salvage_fence(b"{\"fence\": 12, \"x\": {\"fence\":99"),
            Some(99)
        );
        assert_eq!(salvage_fence(b"\0\0garbage"), None);
        assert_eq!(salvage_fence(b"\"fence\": 99999999999999999999999"), None);
    }
}
