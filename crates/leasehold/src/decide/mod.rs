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

use crate::record::{LeaseRecord, QueuedWaiter};
use crate::store::{AcquireOutcome, AcquireRequest, LostReason, ReleaseOutcome, RenewOutcome};

mod line;
pub(crate) mod permits;
use crate::holder::{host, pid};
pub(crate) use line::{leave_line, tidy_line, wait_in_line};
pub(crate) use permits::force_freed;
/// What the Redis store, which keeps these rules in its Lua scripts, and the etcd store, which
/// keeps them in its transactions, build their answers with.
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) use permits::{asked, held_view, mismatch, view};
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
    /// `ms` Unix milliseconds (tests).
    #[cfg(test)]
    pub(crate) fn at_ms(ms: u64) -> Self {
        Now { ms, us: ms * 1000 }
    }

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
    /// Bit `i` set: the permit holder `i` of the [`permits`](LeaseRecord::permits) table (its
    /// token and written expiry) has been seen unchanged for its TTL plus the drift margin.
    pub permits_lapsed: u64,
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

/// How one step is judged: the time, the [`Expiry`] rule, and the floor of a grant's fence. Its
/// methods decide the steps of the lock's life, each answering once with a [`Decision`]; every
/// store built on these rules calls them (the memory and file stores with [`Rules::clock`], the
/// record adapter with its observations), and the native stores' server-side rules mirror them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// The time of the step.
    pub now: Now,
    /// How the times written in a record are judged.
    pub expiry: Expiry,
    /// No fence is granted below it (now in microseconds for a clock-floored counter).
    pub fence_floor: u64,
}

/// What a step decided: its answer, and the record to write (`None`: nothing changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision<O> {
    /// The step's answer.
    pub outcome: O,
    /// The record to write.
    pub write: Option<LeaseRecord>,
}

impl<O> Decision<O> {
    fn of((outcome, write): (O, Option<LeaseRecord>)) -> Self {
        Decision { outcome, write }
    }
}

impl Rules {
    /// Times judged on this clock ([`Expiry::Clock`]: one process, or the processes of one host),
    /// fences floored at `now` in microseconds.
    pub(crate) fn clock(now: Now) -> Self {
        Rules {
            now,
            expiry: Expiry::Clock,
            fence_floor: now.us,
        }
    }

    /// Decides an acquisition of a lock or of a permit ([`AcquireRequest::permit`]).
    /// `holder_dead` is true when the store knows the recorded holder's process is gone. A
    /// request of a kind the key is not (a lock on a semaphore, another permit count) while the
    /// key has holders or waiters is refused.
    pub(crate) fn acquire(
        &self,
        current: Current<'_>,
        req: &AcquireRequest,
        holder_dead: bool,
    ) -> crate::error::Result<Decision<AcquireOutcome>> {
        let Rules {
            now,
            expiry,
            fence_floor,
        } = *self;
        if let Some(want) = req.permit {
            return permits::acquire(current, req, want, now, expiry, fence_floor)
                .map(Decision::of);
        }
        let lock;
        let current = match current {
            Current::Record(r) if r.permits.is_some() => {
                lock = permits::as_lock(r, req, expiry, now.ms)?;
                Current::Record(&lock)
            }
            c => c,
        };
        Ok(Decision::of(self.acquire_lock(current, req, holder_dead)))
    }

    /// Decides a renewal of `token`'s lease (or permit) for `ttl_ms`: the record to write when it
    /// is still ours, with the lapsed places in line dropped.
    pub(crate) fn renew(
        &self,
        current: Option<&LeaseRecord>,
        token: &str,
        ttl_ms: u64,
    ) -> Decision<RenewOutcome> {
        Decision::of(renew_lease(
            current,
            token,
            ttl_ms,
            self.now.ms,
            self.expiry,
        ))
    }

    /// Decides a release of `token`'s lease (or permit): the free record to write, fence and live
    /// waiters kept. A lease that expired but was not taken over is still cleared, and answered
    /// as not held.
    pub(crate) fn release(
        &self,
        current: Option<&LeaseRecord>,
        token: &str,
    ) -> Decision<ReleaseOutcome> {
        Decision::of(release_lease(current, token, self))
    }

    /// The record `r` with its holder removed: fence and key kept, and the places in line that
    /// are still live.
    pub(crate) fn freed(&self, r: &LeaseRecord) -> LeaseRecord {
        freed(r, self.now.ms, self.expiry)
    }

    /// Whether `cleanup` may delete `r`: its lease over, no permit held, nobody live in line,
    /// and unwritten for `older_than`. How long it has gone unwritten is the server's `age` of
    /// it where the store reads the server's clock (then no wall clock is read: the skew
    /// shortcut is not taken), else the newest time written in it against [`Rules::now`].
    pub(crate) fn removable(
        &self,
        r: &LeaseRecord,
        age: Option<Duration>,
        older_than: Duration,
    ) -> bool {
        let expiry = self.expiry;
        let now_ms = if age.is_some() { 0 } else { self.now.ms };
        let unwritten_long_enough = match age {
            Some(age) => age >= older_than,
            None => {
                let last = r.renewed_ms.max(r.acquired_ms).max(r.expires_ms);
                let last = r
                    .permits
                    .iter()
                    .flat_map(|t| &t.holders)
                    .fold(last, |l, p| l.max(p.renewed_ms).max(p.expires_ms));
                last.saturating_add(crate::record::ms(older_than)) <= now_ms
            }
        };
        expiry.lease_over(r, now_ms)
            && !permits::any_held(r, expiry, now_ms)
            && !expiry.anyone_waiting(r, now_ms)
            && unwritten_long_enough
    }
}

impl Rules {
    /// Decides an acquisition of a lock.
    fn acquire_lock(
        &self,
        current: Current<'_>,
        req: &AcquireRequest,
        holder_dead: bool,
    ) -> (AcquireOutcome, Option<LeaseRecord>) {
        let Rules {
            now,
            expiry,
            fence_floor,
        } = *self;
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
            if held && r.token.as_deref() == Some(req.token.as_str()) {
                // Ours already: an earlier attempt of this acquisition was granted and its answer
                // lost. Granted again as a renewal, in the same write: the lease counts from now,
                // as the holder's `valid_until` counts from this attempt's send, never from the
                // first grant's (after which the store would free it first).
                if line.unclaimed && !claim(&mut line, req, fence_floor, now.ms) {
                    return (exhausted(req.key.as_str(), line.fence), None);
                }
                renewed(&mut line, crate::record::ms(req.ttl), now.ms);
                leave_line(&mut line, &req.token);
                return (AcquireOutcome::Granted(line.clone()), Some(line));
            }
            let place = line.place_of(&req.token);
            let reserved_for_other = !held && line.waiter_token.is_some() && place != Some(0);
            if held || reserved_for_other {
                let (seen, write) = wait_in_line(line, req, now.ms);
                return (AcquireOutcome::Held(seen), write);
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
            return (exhausted(req.key.as_str(), base_fence), None);
        };
        let fence = next.max(fence_floor);
        grant(&mut g, req, fence, now.ms);
        // The first in line (or nobody) was granted: the next one moves up.
        leave_line(&mut g, &req.token);
        (AcquireOutcome::Granted(g.clone()), Some(g))
    }
}

/// The holder a key whose fence cannot grow any more reads as held by: no later grant could be
/// fenced above the last one, so none is made.
pub(crate) const FENCE_EXHAUSTED: &str =
    "nobody: the key's fence reached its largest value (u64::MAX), so it is never granted again";

/// What an acquirer of `key`, whose fence `fence` cannot grow, is answered: held by
/// [`FENCE_EXHAUSTED`].
fn exhausted(key: &str, fence: u64) -> AcquireOutcome {
    let mut r = LeaseRecord::free(key, fence);
    r.holder = Some(FENCE_EXHAUSTED.to_owned());
    AcquireOutcome::Held(r)
}

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
    g.unclaimed = false;
}

/// Claims in `g` the lease a release granted to `req`'s acquisition as the first in line
/// ([`LeaseRecord::unclaimed`]): this process's holder, labels and process, and, for a block of
/// more than one fence, a new block above every fence issued (the grant issued one). False when
/// the fence cannot grow that far.
fn claim(g: &mut LeaseRecord, req: &AcquireRequest, fence_floor: u64, now_ms: u64) -> bool {
    let fence = if req.fences > 1 {
        let Some(next) = g.fence.checked_add(req.fences) else {
            return false;
        };
        next.max(fence_floor)
    } else {
        g.fence
    };
    grant(g, req, fence, now_ms);
    true
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

/// Decides a renewal; whether a waiter registration has lapsed is judged with `expiry` (the
/// holder's own lease is always judged on its own clock: it wrote it).
fn renew_lease(
    current: Option<&LeaseRecord>,
    token: &str,
    ttl_ms: u64,
    now_ms: u64,
    expiry: Expiry,
) -> (RenewOutcome, Option<LeaseRecord>) {
    if let Some(r) = current.filter(|r| r.permits.is_some()) {
        return permits::renew(r, token, ttl_ms, now_ms, expiry);
    }
    if let Some(reason) = lost_reason(current, token, now_ms) {
        return (RenewOutcome::Lost(reason), None);
    }
    let Some(r) = current else {
        return (RenewOutcome::Lost(LostReason::Released), None);
    };
    let mut n = r.clone();
    renewed(&mut n, ttl_ms, now_ms);
    tidy_line(&mut n, expiry, now_ms);
    (RenewOutcome::Renewed(n.clone()), Some(n))
}

/// Writes a renewal of the lease in `r` for `ttl_ms` at `now_ms`.
fn renewed(r: &mut LeaseRecord, ttl_ms: u64, now_ms: u64) {
    r.renewed_ms = now_ms;
    r.ttl_ms = ttl_ms;
    r.expires_ms = now_ms.saturating_add(ttl_ms);
}

/// Decides a release; whether the places in line are kept is judged with `rules.expiry`. The
/// release is the grant: the first live waiter in line is made the holder in the same write
/// (see [`grant_to_first_in_line`]).
fn release_lease(
    current: Option<&LeaseRecord>,
    token: &str,
    rules: &Rules,
) -> (ReleaseOutcome, Option<LeaseRecord>) {
    let (now_ms, expiry) = (rules.now.ms, rules.expiry);
    if let Some(r) = current.filter(|r| r.permits.is_some()) {
        return permits::release(r, token, now_ms, expiry);
    }
    match current {
        Some(r) if r.token.as_deref() == Some(token) => {
            let outcome = if r.expires_ms > now_ms {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotHeld
            };
            let mut f = freed(r, now_ms, expiry);
            grant_to_first_in_line(&mut f, rules);
            (outcome, Some(f))
        }
        _ => (ReleaseOutcome::NotHeld, None),
    }
}

/// Makes the registered waiter of the freed record `f` (its line tidied: the registered waiter
/// is live) its holder, [`unclaimed`](LeaseRecord::unclaimed), with the next fence: the lease
/// lasts for what is left of the waiter's place, with the place's lifetime as its TTL (so a
/// reader that judges by observation lets it lapse as the place would have), until the waiter's
/// next acquire attempt claims it. The next in line moves up. Nothing changes when nobody is
/// in line, when the waiter is another client's ([`crate::record::FOREIGN_WAITER`]: it takes a
/// free lease itself), or when the fence cannot grow.
fn grant_to_first_in_line(f: &mut LeaseRecord, rules: &Rules) {
    let (Some(waiter), Some(token), Some(expires)) = (
        f.waiter.clone(),
        f.waiter_token.clone(),
        f.waiter_expires_ms,
    ) else {
        return;
    };
    if token.starts_with(crate::record::FOREIGN_WAITER) {
        return;
    }
    let Some(next) = f.fence.checked_add(1) else {
        return;
    };
    let ttl_ms = f
        .waiter_ttl_ms
        .unwrap_or_else(|| f.ttl_ms.max(LEGACY_WAITER_TTL_MS));
    f.holder = Some(waiter);
    f.token = Some(token.clone());
    f.fence = next.max(rules.fence_floor);
    f.acquired_ms = rules.now.ms;
    f.renewed_ms = rules.now.ms;
    f.expires_ms = expires;
    f.ttl_ms = ttl_ms;
    f.pid = None;
    f.host = None;
    f.labels.clear();
    f.unclaimed = true;
    leave_line(f, &token);
}

/// The record `r` with its holder removed; the waiter registration is kept while `expiry` judges
/// it live.
fn freed(r: &LeaseRecord, now_ms: u64, expiry: Expiry) -> LeaseRecord {
    let mut f = r.clone();
    f.holder = None;
    f.token = None;
    f.expires_ms = 0;
    f.renewed_ms = now_ms;
    f.store.clear();
    f.unclaimed = false;
    tidy_line(&mut f, expiry, now_ms);
    f
}

/// Decides a waiter withdrawal: the record to write if `token` stood in line (registered or
/// queued), or holds a lease a release granted it that it has not claimed
/// ([`LeaseRecord::unclaimed`]): that lease is released, and so granted to the next in line.
pub(crate) fn withdraw_waiter(
    current: Option<&LeaseRecord>,
    token: &str,
    rules: &Rules,
) -> Option<LeaseRecord> {
    let r = current?;
    if r.unclaimed && r.token.as_deref() == Some(token) {
        return release_lease(current, token, rules).1;
    }
    let mut n = r.clone();
    if !leave_line(&mut n, token) {
        return None;
    }
    if let Some(t) = n.permits.as_mut() {
        t.writers_waiting.retain(|w| w != token);
    }
    Some(n)
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
mod tests;
