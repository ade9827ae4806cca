//! The lock decision logic, pure: records in, decision out, the clocks passed in.
//!
//! Shared by the memory store, the file store and the generic [`crate::adapter::RecordLockStore`], so
//! every store built on records follows one algorithm:
//!
//! * a lease is **held** while it has an owner token and has not expired (and, where the store can
//!   tell, its holder process is alive);
//! * a free or expired lease goes to the acquirer, **unless** a live waiter other than the acquirer
//!   is registered: then it is reserved for that waiter;
//! * waiters stand in line: the registered waiter (`waiter`) first, then the
//!   [`queue`](LeaseRecord::queue) in arrival order. A waiting acquirer joins the end of the line
//!   once and keeps its place by renewing it; a grant to the first in line moves the next one up;
//!   a place that lapses (judged like the registered waiter's) is dropped by the next write;
//! * how "expired" and "live" are judged is the [`Expiry`] rule the store passes: by the written
//!   times on a clock the writer shares ([`Expiry::Clock`]), or, for records written by other
//!   machines, by how long the record has been **observed unchanged** on the decider's monotonic
//!   clock, with a wall-clock shortcut bounded by an assumed maximum skew ([`Expiry::Observed`]);
//! * every grant's fence is `max(previous fence + n, floor)` for a block of `n` fences, where the
//!   floor is the store's: now in microseconds for stores that keep the fence as a clock-floored
//!   counter, none for stores whose versions give a floor a deletion cannot lower (the adapter
//!   derives those fences from versions, see [`crate::adapter`]).

use crate::record::{LeaseRecord, QueuedWaiter, QUEUE_LIMIT};
use crate::store::{AcquireOutcome, AcquireRequest, LostReason, ReleaseOutcome, RenewOutcome};
use std::sync::OnceLock;
use std::time::Duration;

/// What a store found under a key before deciding.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Current<'a> {
    /// No record.
    Missing,
    /// A record that does not parse, with a fence recovered from its bytes if any. Nobody can
    /// tell from it who holds the lease or until when, so it reads as held by
    /// [`CORRUPT_HOLDER`] until the store knows better: `over` is true once the store can tell
    /// that whoever wrote it holds nothing any more (the file store: no process holds the
    /// record's kernel lock; the record adapter: the damaged bytes were seen unchanged for longer
    /// than any lease on the store can last, see [`corrupt_observation`]).
    Corrupt {
        /// The salvaged fence.
        salvaged_fence: Option<u64>,
        /// Whether its holder, whoever it was, certainly holds nothing any more.
        over: bool,
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

/// How a decision judges the times written in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// The writer's clock is the decider's (one process, or the processes of one host): compare
    /// the written `expires` and `waiter_expires` with [`Now::ms`].
    Clock,
    /// The writer may be another machine with another wall clock: judge by observation.
    Observed(Observed),
}

/// What a decider saw of a record on its own monotonic clock, and the skew it assumes.
///
/// The holder's lease has passed once the holder's part of the record (token, fence, times) was
/// seen unchanged for the record's TTL plus the drift margin: a holder that still holds it
/// renews well within its TTL, each renewal changes that part, and its own `lost()` fires at
/// TTL − drift after its last renewal was sent, which is before this decider first saw that
/// renewal. Shortcut: a written expiry older than now − `max_skew` on the decider's wall clock
/// has passed whatever the writer's clock said, as long as no two clocks differ by more than
/// `max_skew`. A waiter registration lapses the same way, on its own lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observed {
    /// How long the holder's part of the record has been seen unchanged (zero on first sight).
    pub lease_unchanged: Duration,
    /// How long the waiter registration has been seen unchanged (zero on first sight).
    pub waiter_unchanged: Duration,
    /// The largest difference between two machines' wall clocks that is assumed.
    pub max_skew: Duration,
    /// Bit `i` set: the [`queue`](LeaseRecord::queue) entry `i` (its token and written expiry)
    /// has been seen unchanged for its lifetime plus the drift margin.
    pub queue_lapsed: u64,
}

/// A waiter registration without a recorded lifetime (written before records carried one) is
/// judged on the lease's TTL, and at least this long.
const LEGACY_WAITER_TTL_MS: u64 = 5_000;

impl Expiry {
    /// Whether the lease in `r` (its holder's part) is over at `now_ms`. A record without an
    /// owner token is free at once.
    pub(crate) fn lease_over(&self, r: &LeaseRecord, now_ms: u64) -> bool {
        if r.token.is_none() {
            return true;
        }
        match self {
            Expiry::Clock => r.expires_ms <= now_ms,
            Expiry::Observed(o) => {
                o.lease_unchanged >= observation_needed(r.ttl_ms)
                    || passed_beyond_skew(r.expires_ms, o.max_skew, now_ms)
            }
        }
    }

    /// Whether the lease in `r` is held by a live holder at `now_ms`.
    pub(crate) fn held(&self, r: &LeaseRecord, now_ms: u64) -> bool {
        !self.lease_over(r, now_ms)
    }

    /// Whether `r` carries a live waiter registration at `now_ms`.
    pub(crate) fn waiter_live(&self, r: &LeaseRecord, now_ms: u64) -> bool {
        let (Some(_), Some(expires)) = (&r.waiter_token, r.waiter_expires_ms) else {
            return false;
        };
        match self {
            Expiry::Clock => expires > now_ms,
            Expiry::Observed(o) => {
                let lifetime = r
                    .waiter_ttl_ms
                    .unwrap_or_else(|| r.ttl_ms.max(LEGACY_WAITER_TTL_MS));
                !(o.waiter_unchanged >= observation_needed(lifetime)
                    || passed_beyond_skew(expires, o.max_skew, now_ms))
            }
        }
    }

    /// Whether the queued waiter `w`, entry `i` of `r`'s queue, still has its place at `now_ms`.
    pub(crate) fn queued_live(&self, i: usize, w: &QueuedWaiter, now_ms: u64) -> bool {
        match self {
            Expiry::Clock => w.expires_ms > now_ms,
            Expiry::Observed(o) => {
                let seen_lapse = i < 64 && o.queue_lapsed & (1 << i) != 0;
                !(seen_lapse || passed_beyond_skew(w.expires_ms, o.max_skew, now_ms))
            }
        }
    }

    /// Whether anybody is waiting in `r`'s line at `now_ms`: the registered waiter or a queued one.
    pub(crate) fn anyone_waiting(&self, r: &LeaseRecord, now_ms: u64) -> bool {
        self.waiter_live(r, now_ms)
            || r.queue
                .iter()
                .enumerate()
                .any(|(i, w)| self.queued_live(i, w, now_ms))
    }
}

/// Drops from `r`'s line every waiter whose place has lapsed (judged with `expiry` on `r` as it
/// was read: call it before anything else changes the queue), and moves the first live queued
/// waiter up when the registered one is gone.
pub(crate) fn tidy_line(r: &mut LeaseRecord, expiry: Expiry, now_ms: u64) {
    let head_live = expiry.waiter_live(r, now_ms);
    let queue: Vec<QueuedWaiter> = std::mem::take(&mut r.queue)
        .into_iter()
        .enumerate()
        .filter(|(i, w)| expiry.queued_live(*i, w, now_ms))
        .map(|(_, w)| w)
        .collect();
    r.queue = queue;
    if !head_live {
        clear_waiter(r);
        promote(r);
    }
    // A token stands in line once.
    if let Some(t) = r.waiter_token.clone() {
        r.queue.retain(|w| w.token != t);
    }
}

/// Where `token` stands in `r`'s line: 0 for the registered waiter, 1 for the first queued one, …
pub(crate) fn position(r: &LeaseRecord, token: &str) -> Option<usize> {
    if r.waiter_token.as_deref() == Some(token) {
        return Some(0);
    }
    r.queue.iter().position(|w| w.token == token).map(|i| i + 1)
}

/// Makes the first queued waiter of `r` the registered one, if nobody is registered.
fn promote(r: &mut LeaseRecord) {
    if r.waiter_token.is_none() && !r.queue.is_empty() {
        let w = r.queue.remove(0);
        r.waiter = Some(w.holder);
        r.waiter_token = Some(w.token);
        r.waiter_expires_ms = Some(w.expires_ms);
        r.waiter_ttl_ms = Some(w.ttl_ms);
    }
}

/// Takes `token` out of `r`'s line; whether it stood in it.
pub(crate) fn leave_line(r: &mut LeaseRecord, token: &str) -> bool {
    match position(r, token) {
        Some(0) => {
            clear_waiter(r);
            promote(r);
            true
        }
        Some(p) => {
            r.queue.remove(p - 1);
            true
        }
        None => false,
    }
}

/// How long a record written with a lifetime of `ttl_ms` must be seen unchanged before it has
/// surely lapsed on its writer's side: the lifetime plus the drift margin.
pub(crate) fn observation_needed(ttl_ms: u64) -> Duration {
    let ttl = Duration::from_millis(ttl_ms);
    ttl + crate::options::drift(ttl)
}

/// Whether a time `written_ms` on some machine's wall clock has passed at `now_ms` on ours even if
/// the two clocks differ by `max_skew`.
fn passed_beyond_skew(written_ms: u64, max_skew: Duration, now_ms: u64) -> bool {
    written_ms.saturating_add(crate::record::ms(max_skew)) <= now_ms
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

/// Decides an acquisition, judging times on this clock ([`Expiry::Clock`]) and flooring the fence
/// at now in microseconds. Returns the outcome and the record to write, if anything changes.
/// `holder_dead` is true when the store knows the recorded holder's process is gone.
pub(crate) fn acquire(
    current: Current<'_>,
    req: &AcquireRequest,
    now: Now,
    holder_dead: bool,
) -> (AcquireOutcome, Option<LeaseRecord>) {
    acquire_judged(current, req, now, holder_dead, Expiry::Clock, now.us)
}

/// Decides an acquisition with the `expiry` rule and a grant's fence floored at `fence_floor`.
pub(crate) fn acquire_judged(
    current: Current<'_>,
    req: &AcquireRequest,
    now: Now,
    holder_dead: bool,
    expiry: Expiry,
    fence_floor: u64,
) -> (AcquireOutcome, Option<LeaseRecord>) {
    let base_fence = match current {
        Current::Missing => 0,
        Current::Corrupt { salvaged_fence, .. } => salvaged_fence.unwrap_or(0),
        Current::Record(r) => r.fence,
    };
    if let Current::Corrupt { over: false, .. } = current {
        return (
            AcquireOutcome::Held(corrupt_placeholder(req.key.as_str(), base_fence, now.ms)),
            None,
        );
    }
    // The record with its lapsed waiters dropped: what a grant starts from.
    let mut tidied = None;
    if let Current::Record(r) = current {
        let held = expiry.held(r, now.ms) && !holder_dead;
        let mut line = r.clone();
        tidy_line(&mut line, expiry, now.ms);
        let place = position(&line, &req.token);
        let reserved_for_other = !held && line.waiter_token.is_some() && place != Some(0);
        if held || reserved_for_other {
            if let Some(wttl) = req.waiter_ttl {
                let wttl_ms = crate::record::ms(wttl);
                let renewed = now.ms + wttl_ms;
                match place {
                    Some(p) => {
                        let expires = match p {
                            0 => line.waiter_expires_ms.unwrap_or(0),
                            p => line.queue[p - 1].expires_ms,
                        };
                        // A fresh place of ours is left alone: rewriting it on every attempt
                        // would wake every watcher (ourselves included) for nothing. Ours was
                        // written on this clock, so its written expiry is judged directly.
                        if expires >= now.ms + wttl_ms * 2 / 3 && expires > now.ms {
                            return (AcquireOutcome::Held(line), None);
                        }
                        if p == 0 {
                            line.waiter = Some(req.holder.clone());
                            line.waiter_expires_ms = Some(renewed);
                            line.waiter_ttl_ms = Some(wttl_ms);
                        } else {
                            let w = &mut line.queue[p - 1];
                            w.expires_ms = renewed;
                            w.ttl_ms = wttl_ms;
                        }
                        return (AcquireOutcome::Held(line.clone()), Some(line));
                    }
                    None if line.queue.len() < QUEUE_LIMIT => {
                        line.queue.push(QueuedWaiter::new(
                            req.holder.clone(),
                            req.token.clone(),
                            renewed,
                            wttl_ms,
                        ));
                        promote(&mut line);
                        return (AcquireOutcome::Held(line.clone()), Some(line));
                    }
                    // The line is full: wait without a place.
                    None => {}
                }
            }
            return (AcquireOutcome::Held(line), None);
        }
        tidied = Some(line);
    }
    let mut g = match tidied {
        Some(mut g) => {
            g.store.clear();
            g
        }
        None => LeaseRecord::free(req.key.as_str(), 0),
    };
    // A fence that would pass u64::MAX is never granted: saturating would hand out the same fence
    // twice. The key reads as held by nobody who can be named, so waiters give up with the reason.
    let Some(next) = base_fence.checked_add(req.fences.max(1)) else {
        let mut r = LeaseRecord::free(req.key.as_str(), base_fence);
        r.holder = Some(FENCE_EXHAUSTED.to_owned());
        return (AcquireOutcome::Held(r), None);
    };
    let fence = next.max(fence_floor);
    grant(&mut g, req, fence, now.ms);
    // The first in line (or nobody) was granted: the next one moves up.
    leave_line(&mut g, &req.token);
    (AcquireOutcome::Granted(g.clone()), Some(g))
}

/// The holder a key whose fence cannot grow any more reads as held by: no later grant could be
/// fenced above the last one, so none is made.
pub(crate) const FENCE_EXHAUSTED: &str =
    "nobody: the key's fence reached its largest value (u64::MAX), so it is never granted again";

/// The holder a record that cannot be read is held by, until the store can tell it is over.
pub(crate) const CORRUPT_HOLDER: &str = "unknown (corrupt record)";

/// How often a contender looks again at a record that cannot be read (the expiry its placeholder
/// carries, so a waiting acquirer wakes to check).
const CORRUPT_RECHECK_MS: u64 = 1_000;

/// What an acquirer sees of a key whose record cannot be read: held by [`CORRUPT_HOLDER`] under
/// the salvaged fence, for a short while (then it looks again).
pub(crate) fn corrupt_placeholder(key: &str, fence: u64, now_ms: u64) -> LeaseRecord {
    let mut r = LeaseRecord::free(key, fence);
    r.holder = Some(CORRUPT_HOLDER.to_owned());
    r.token = Some(String::new());
    r.acquired_ms = now_ms;
    r.renewed_ms = now_ms;
    r.ttl_ms = CORRUPT_RECHECK_MS;
    r.expires_ms = now_ms + CORRUPT_RECHECK_MS;
    r
}

/// How long a record that cannot be read must be seen unchanged, by a contender asking for a
/// lease of `ttl`, before whoever wrote it certainly holds nothing: no lease on the store is
/// assumed to last longer than the skew bound or the contender's own TTL, and a holder that finds
/// its record damaged loses it at its next renewal; plus the drift margin.
pub(crate) fn corrupt_observation(ttl: Duration, max_skew: Duration) -> Duration {
    observation_needed(crate::record::ms(ttl.max(max_skew)))
}

/// Removes the waiter registration from `r`.
fn clear_waiter(r: &mut LeaseRecord) {
    r.waiter = None;
    r.waiter_token = None;
    r.waiter_expires_ms = None;
    r.waiter_ttl_ms = None;
}

/// Writes the grant of `req` with `fence` at `now_ms` into `g` (holder, token, fence, times, this
/// process, labels); the waiter fields are left as they are.
pub(crate) fn grant(g: &mut LeaseRecord, req: &AcquireRequest, fence: u64, now_ms: u64) {
    g.holder = Some(req.holder.clone());
    g.token = Some(req.token.clone());
    g.fence = fence;
    g.acquired_ms = now_ms;
    g.renewed_ms = now_ms;
    g.ttl_ms = crate::record::ms(req.ttl);
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

/// Decides a renewal: the record to write when it is still ours. A lapsed waiter registration is
/// dropped, judged on this clock.
pub(crate) fn renew(
    current: Option<&LeaseRecord>,
    token: &str,
    ttl_ms: u64,
    now_ms: u64,
) -> (RenewOutcome, Option<LeaseRecord>) {
    renew_judged(current, token, ttl_ms, now_ms, Expiry::Clock)
}

/// Decides a renewal; whether a waiter registration has lapsed is judged with `expiry` (the
/// holder's own lease is always judged on its own clock: it wrote it).
pub(crate) fn renew_judged(
    current: Option<&LeaseRecord>,
    token: &str,
    ttl_ms: u64,
    now_ms: u64,
    expiry: Expiry,
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
    tidy_line(&mut n, expiry, now_ms);
    (RenewOutcome::Renewed(n.clone()), Some(n))
}

/// Decides a release: the free record to write (fence and live waiter kept).
/// A lease that expired but was not taken over is still cleared, and reported as not held.
pub(crate) fn release(
    current: Option<&LeaseRecord>,
    token: &str,
    now_ms: u64,
) -> (ReleaseOutcome, Option<LeaseRecord>) {
    release_judged(current, token, now_ms, Expiry::Clock)
}

/// Decides a release; whether the waiter registration is kept is judged with `expiry`.
pub(crate) fn release_judged(
    current: Option<&LeaseRecord>,
    token: &str,
    now_ms: u64,
    expiry: Expiry,
) -> (ReleaseOutcome, Option<LeaseRecord>) {
    match current {
        Some(r) if r.token.as_deref() == Some(token) => {
            let outcome = if r.expires_ms > now_ms {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            };
            (outcome, Some(freed_judged(r, now_ms, expiry)))
        }
        _ => (ReleaseOutcome::NotHeld, None),
    }
}

/// The record `r` with its holder removed (fence, live waiter and key kept).
pub(crate) fn freed(r: &LeaseRecord, now_ms: u64) -> LeaseRecord {
    freed_judged(r, now_ms, Expiry::Clock)
}

/// The record `r` with its holder removed; the waiter registration is kept while `expiry` judges
/// it live.
pub(crate) fn freed_judged(r: &LeaseRecord, now_ms: u64, expiry: Expiry) -> LeaseRecord {
    let mut f = r.clone();
    f.holder = None;
    f.token = None;
    f.expires_ms = 0;
    f.renewed_ms = now_ms;
    f.store.clear();
    tidy_line(&mut f, expiry, now_ms);
    f
}

/// Decides a waiter withdrawal: the record to write if `token` stood in line (registered or
/// queued).
pub(crate) fn withdraw_waiter(current: Option<&LeaseRecord>, token: &str) -> Option<LeaseRecord> {
    let mut n = current?.clone();
    leave_line(&mut n, token).then_some(n)
}

/// Whether `cleanup` may delete this record: free or expired, no live waiter, untouched for
/// `older_than_ms`, with times judged on this clock.
pub(crate) fn removable(r: &LeaseRecord, now_ms: u64, older_than_ms: u64) -> bool {
    removable_judged(r, now_ms, older_than_ms, Expiry::Clock)
}

/// Whether `cleanup` may delete this record, with expiry judged by `expiry`.
pub(crate) fn removable_judged(
    r: &LeaseRecord,
    now_ms: u64,
    older_than_ms: u64,
    expiry: Expiry,
) -> bool {
    let last = r.renewed_ms.max(r.acquired_ms).max(r.expires_ms);
    expiry.lease_over(r, now_ms)
        && !expiry.anyone_waiting(r, now_ms)
        && last.saturating_add(older_than_ms) <= now_ms
}

/// Whether `cleanup` may delete this record on a store that reads the server's clock: its lease
/// over and no live waiter by what was `seen` of it (observation started at its server age), and
/// unwritten for `older_than` by the server's clock (`age`). No wall clock is read.
pub(crate) fn removable_aged(
    r: &LeaseRecord,
    age: Duration,
    older_than: Duration,
    seen: Observed,
) -> bool {
    let expiry = Expiry::Observed(seen);
    // `now` only feeds the skew shortcut, which a store with a server clock does not take.
    expiry.lease_over(r, 0) && !expiry.anyone_waiting(r, 0) && age >= older_than
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

    /// A skew too long for milliseconds in 64 bits is taken as forever, not cut to its low bits
    /// (2^64 ms + 384 ms read as 384 ms took a record that expired a second ago).
    #[test]
    fn a_huge_skew_never_shortcuts_expiry() {
        let huge = Duration::from_secs(18_446_744_073_709_552);
        assert!(!passed_beyond_skew(1_000, huge, 10_000));
        assert!(!passed_beyond_skew(1_000, Duration::MAX, u64::MAX - 1));
    }

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
                over: true,
            },
            &req("e"),
            at(1),
            false,
        ));
        assert_eq!(e.fence, u64::MAX);
        // The next grant would repeat u64::MAX: refused, the reason in the holder, nothing written.
        let mut free = e.clone();
        free.token = None;
        let (out, write) = acquire(Current::Record(&free), &req("f"), at(1), false);
        assert!(write.is_none());
        match out {
            AcquireOutcome::Held(r) => assert_eq!(r.holder.as_deref(), Some(FENCE_EXHAUSTED)),
            other => panic!("granted past u64::MAX: {other:?}"),
        }
        let (out, _) = acquire(
            Current::Corrupt {
                salvaged_fence: Some(u64::MAX),
                over: true,
            },
            &req("g"),
            at(1),
            false,
        );
        assert!(matches!(out, AcquireOutcome::Held(_)), "{out:?}");
    }

    #[test]
    fn a_record_that_cannot_be_read_is_held_until_the_store_can_tell_it_is_over() {
        let held = Current::Corrupt {
            salvaged_fence: Some(41),
            over: false,
        };
        let (out, write) = acquire(held, &req("a"), at(1_000), false);
        assert!(write.is_none(), "nothing is written over it");
        match out {
            AcquireOutcome::Held(r) => {
                assert_eq!(r.holder.as_deref(), Some(CORRUPT_HOLDER));
                assert_eq!(r.fence, 41, "the salvaged fence is reported");
                assert!(r.is_held(1_000), "a waiting acquirer looks again later");
            }
            other => panic!("a corrupt record was granted while it may be held: {other:?}"),
        }
        let over = Current::Corrupt {
            salvaged_fence: Some(41),
            over: true,
        };
        assert!(granted(acquire(over, &req("a"), at(1), false)).fence > 41);
        // No lease is assumed longer than the skew bound or the contender's TTL.
        let (short, long) = (Duration::from_secs(1), Duration::from_secs(600));
        let skew = Duration::from_secs(300);
        assert!(corrupt_observation(short, skew) > skew);
        assert!(corrupt_observation(long, skew) > long);
    }

    fn seen(lease_ms: u64, waiter_ms: u64) -> Expiry {
        Expiry::Observed(Observed {
            queue_lapsed: 0,
            lease_unchanged: Duration::from_millis(lease_ms),
            waiter_unchanged: Duration::from_millis(waiter_ms),
            max_skew: Duration::from_secs(300),
        })
    }

    #[test]
    fn observed_expiry_ignores_the_writers_wall_clock_within_the_skew_bound() {
        // Written by a holder whose clock is 2 minutes behind ours: by wall clocks it expired
        // long ago; seen unchanged for less than TTL + drift (1012 ms), it is held.
        let behind = granted(acquire(Current::Missing, &req("a"), at(10), false));
        let now = at(120_000);
        let (o, w) = acquire_judged(
            Current::Record(&behind),
            &req("b"),
            now,
            false,
            seen(1011, 0),
            0,
        );
        assert!(matches!(o, AcquireOutcome::Held(_)) && w.is_none(), "{o:?}");
        let got = granted(acquire_judged(
            Current::Record(&behind),
            &req("b"),
            now,
            false,
            seen(1012, 0),
            0,
        ));
        assert_eq!(got.fence, behind.fence + 1, "no clock floor: previous + 1");
        // Written by a holder whose clock is 2 minutes ahead: its expiry is far in our future,
        // yet unchanged for TTL + drift means it is over.
        let ahead = granted(acquire(Current::Missing, &req("a"), at(240_000), false));
        granted(acquire_judged(
            Current::Record(&ahead),
            &req("b"),
            at(120_000),
            false,
            seen(1012, 0),
            0,
        ));
        // First sight: only an expiry older than now − the bound (300 s) has passed.
        let old = granted(acquire(Current::Missing, &req("a"), at(10), false));
        let (o, _) = acquire_judged(
            Current::Record(&old),
            &req("b"),
            at(300_000),
            false,
            seen(0, 0),
            0,
        );
        assert!(matches!(o, AcquireOutcome::Held(_)), "{o:?}");
        granted(acquire_judged(
            Current::Record(&old),
            &req("b"),
            at(301_010),
            false,
            seen(0, 0),
            0,
        ));
        // Released: free at once, whatever was observed.
        let (_, free) = release(Some(&old), "a", 20);
        granted(acquire_judged(
            Current::Record(&free.unwrap()),
            &req("b"),
            at(0),
            false,
            seen(0, 0),
            0,
        ));
    }

    #[test]
    fn observed_waiters_lapse_after_their_recorded_lifetime() {
        let a = granted(acquire(Current::Missing, &req("a"), at(10), false));
        let mut w = req("w");
        w.waiter_ttl = Some(Duration::from_millis(300));
        let (_, reg) = acquire(Current::Record(&a), &w, at(20), false);
        let mut reg = reg.unwrap();
        // The waiter's clock was 2 minutes ahead of ours.
        reg.waiter_expires_ms = Some(120_320);
        assert_eq!(reg.waiter_ttl_ms, Some(300));
        let (_, free) = release(Some(&reg), "a", 30);
        let free = free.unwrap();
        assert!(
            free.waiter_token.is_some(),
            "a live waiter survives the release"
        );
        let (o, _) = acquire_judged(
            Current::Record(&free),
            &req("z"),
            at(40),
            false,
            seen(0, 304),
            0,
        );
        assert!(matches!(o, AcquireOutcome::Held(_)), "reserved: {o:?}");
        let got = granted(acquire_judged(
            Current::Record(&free),
            &req("z"),
            at(40),
            false,
            seen(0, 305),
            0,
        ));
        assert!(
            got.waiter_token.is_none(),
            "the lapsed registration is dropped"
        );
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
        // A second waiter does not replace a live one: it stands in line behind it.
        let mut x = req("x");
        x.waiter_ttl = Some(Duration::from_millis(300));
        let behind = acquire(Current::Record(&reg), &x, at(30), false).1.unwrap();
        assert_eq!(behind.waiter_token.as_deref(), Some("w"));
        assert_eq!(position(&behind, "x"), Some(1));
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

    fn waiting(token: &str) -> AcquireRequest {
        let mut w = req(token);
        w.waiter_ttl = Some(Duration::from_millis(300));
        w
    }

    /// Writes what `acquire` decides for `r` and returns it (the record unchanged if nothing).
    fn attempt(r: &LeaseRecord, q: &AcquireRequest, now: u64, expiry: Expiry) -> LeaseRecord {
        let (_, w) = acquire_judged(Current::Record(r), q, at(now), false, expiry, 0);
        w.unwrap_or_else(|| r.clone())
    }

    #[test]
    fn waiters_are_served_in_arrival_order() {
        let mut r = granted(acquire(Current::Missing, &req("a"), at(10), false));
        for t in ["w1", "w2", "w3"] {
            r = attempt(&r, &waiting(t), 20, Expiry::Clock);
        }
        assert_eq!(
            ["w1", "w2", "w3"].map(|t| position(&r, t)),
            [Some(0), Some(1), Some(2)]
        );
        // Asking again keeps one's place (no second entry).
        r = attempt(&r, &waiting("w2"), 30, Expiry::Clock);
        assert_eq!(r.queue.len(), 2);
        let (_, freed) = release(Some(&r), "a", 40);
        let mut r = freed.unwrap();
        for (i, t) in ["w1", "w2", "w3"].into_iter().enumerate() {
            // Nobody behind the first in line is granted, nor is a newcomer.
            for other in ["w1", "w2", "w3", "late"].into_iter().filter(|o| *o != t) {
                let (out, _) = acquire(Current::Record(&r), &req(other), at(50), false);
                assert!(matches!(out, AcquireOutcome::Held(_)), "{other} before {t}");
            }
            let g = granted(acquire(Current::Record(&r), &waiting(t), at(50), false));
            assert_eq!(position(&g, t), None, "granted, out of line");
            assert_eq!(g.queue.len(), 1usize.saturating_sub(i), "{i}");
            r = release(Some(&g), t, 60).1.unwrap();
        }
        assert!(r.waiter_token.is_none() && r.queue.is_empty());
        granted(acquire(Current::Record(&r), &req("late"), at(70), false));
    }

    #[test]
    fn lapsed_places_are_dropped_and_withdrawals_leave_the_line() {
        let mut r = granted(acquire(Current::Missing, &req("a"), at(10), false));
        for (t, now) in [("w1", 20), ("w2", 25), ("w3", 30)] {
            r = attempt(&r, &waiting(t), now, Expiry::Clock);
        }
        // w2 withdraws from the middle; w1 from the front: w3 moves up.
        let r2 = withdraw_waiter(Some(&r), "w2").unwrap();
        assert_eq!(position(&r2, "w3"), Some(1));
        let r1 = withdraw_waiter(Some(&r2), "w1").unwrap();
        assert_eq!(position(&r1, "w3"), Some(0));
        assert_eq!(r1.waiter_ttl_ms, Some(300));
        assert!(withdraw_waiter(Some(&r1), "w1").is_none());
        // By the clock: at 326 w1's and w2's places (320, 325) have lapsed, w3's (330) has not.
        let (RenewOutcome::Renewed(ren), _) = renew(Some(&r), "a", 1000, 326) else {
            panic!()
        };
        assert_eq!((position(&ren, "w3"), ren.queue.len()), (Some(0), 0));
        // Observed: queued place 1 (w3) seen unchanged for its lifetime; the others not.
        let mut o = match seen(0, 0) {
            Expiry::Observed(o) => o,
            Expiry::Clock => unreachable!(),
        };
        o.queue_lapsed = 0b10;
        let (RenewOutcome::Renewed(ren), _) =
            renew_judged(Some(&r), "a", 1000, 40, Expiry::Observed(o))
        else {
            panic!()
        };
        assert_eq!(
            ["w1", "w2", "w3"].map(|t| position(&ren, t)),
            [Some(0), Some(1), None]
        );
        // A lapsed first place: the next one is served, not the lapsed one.
        let mut stale = release(Some(&r), "a", 40).1.unwrap();
        stale.waiter_expires_ms = Some(41);
        let (out, _) = acquire(Current::Record(&stale), &req("w1"), at(50), false);
        assert!(matches!(out, AcquireOutcome::Held(_)));
        let g = granted(acquire(
            Current::Record(&stale),
            &waiting("w2"),
            at(50),
            false,
        ));
        assert_eq!(position(&g, "w3"), Some(0));
        // Cleanup leaves a record somebody stands in line for.
        let mut f = LeaseRecord::free("k", 1);
        f.queue = vec![QueuedWaiter::new("q", "q", 500, 300)];
        assert!(!removable(&f, 100, 0));
        assert!(removable(&f, 600, 0));
    }

    #[test]
    fn the_line_is_bounded() {
        let mut r = granted(acquire(Current::Missing, &req("a"), at(10), false));
        for i in 0..QUEUE_LIMIT + 1 {
            r = attempt(&r, &waiting(&format!("w{i}")), 20, Expiry::Clock);
        }
        assert_eq!(r.queue.len(), QUEUE_LIMIT);
        let (out, w) = acquire(Current::Record(&r), &waiting("one-too-many"), at(20), false);
        assert!(matches!(out, AcquireOutcome::Held(_)) && w.is_none());
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
