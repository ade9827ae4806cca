use super::*;
use crate::key::Key;
use crate::record::QUEUE_LIMIT;
use std::time::Duration;

// The steps as the tests below take them, each decided by `Rules`.

fn rules(now_ms: u64, expiry: Expiry, fence_floor: u64) -> Rules {
    Rules {
        now: Now::at_ms(now_ms),
        expiry,
        fence_floor,
    }
}

/// A withdrawal judged on this clock at time 0.
pub(crate) fn withdraw_waiter(current: Option<&LeaseRecord>, token: &str) -> Option<LeaseRecord> {
    super::withdraw_waiter(current, token, &rules(0, Expiry::Clock, 0))
}

fn acquire(
    current: Current<'_>,
    req: &AcquireRequest,
    now: Now,
    holder_dead: bool,
) -> (AcquireOutcome, Option<LeaseRecord>) {
    acquire_judged(current, req, now, holder_dead, Expiry::Clock, now.us)
}

fn acquire_judged(
    current: Current<'_>,
    req: &AcquireRequest,
    now: Now,
    holder_dead: bool,
    expiry: Expiry,
    fence_floor: u64,
) -> (AcquireOutcome, Option<LeaseRecord>) {
    match acquire_any(current, req, now, holder_dead, expiry, fence_floor) {
        Ok(d) => d,
        Err(e) => panic!("a lock request refused: {e}"),
    }
}

/// An acquisition decided by `Rules`, answered as a pair (the permit tests' too).
pub(super) fn acquire_any(
    current: Current<'_>,
    req: &AcquireRequest,
    now: Now,
    holder_dead: bool,
    expiry: Expiry,
    fence_floor: u64,
) -> crate::error::Result<(AcquireOutcome, Option<LeaseRecord>)> {
    let rules = Rules {
        now,
        expiry,
        fence_floor,
    };
    let d = rules.acquire(current, req, holder_dead)?;
    Ok((d.outcome, d.write))
}

fn renew(
    current: Option<&LeaseRecord>,
    token: &str,
    ttl_ms: u64,
    now_ms: u64,
) -> (RenewOutcome, Option<LeaseRecord>) {
    renew_judged(current, token, ttl_ms, now_ms, Expiry::Clock)
}

fn renew_judged(
    current: Option<&LeaseRecord>,
    token: &str,
    ttl_ms: u64,
    now_ms: u64,
    expiry: Expiry,
) -> (RenewOutcome, Option<LeaseRecord>) {
    let d = rules(now_ms, expiry, 0).renew(current, token, ttl_ms);
    (d.outcome, d.write)
}

fn release(
    current: Option<&LeaseRecord>,
    token: &str,
    now_ms: u64,
) -> (ReleaseOutcome, Option<LeaseRecord>) {
    let d = rules(now_ms, Expiry::Clock, 0).release(current, token);
    (d.outcome, d.write)
}

/// Whether cleanup may delete `r` at `now_ms` (the permit tests' too).
pub(super) fn removable(r: &LeaseRecord, now_ms: u64, older_than_ms: u64) -> bool {
    rules(now_ms, Expiry::Clock, 0).removable(r, None, Duration::from_millis(older_than_ms))
}

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
    Now::at_ms(ms)
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
        permits_lapsed: 0,
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
    // Freed (a release would grant the waiter the lease).
    let free = super::freed(&reg, 30, Expiry::Clock);
    assert!(
        free.waiter_token.is_some(),
        "a live waiter survives the holder's end"
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
    assert_eq!(behind.place_of("x"), Some(1));
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
        ["w1", "w2", "w3"].map(|t| r.place_of(t)),
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
        assert_eq!(g.place_of(t), None, "granted, out of line");
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
    assert_eq!(r2.place_of("w3"), Some(1));
    let r1 = withdraw_waiter(Some(&r2), "w1").unwrap();
    assert_eq!(r1.place_of("w3"), Some(0));
    assert_eq!(r1.waiter_ttl_ms, Some(300));
    assert!(withdraw_waiter(Some(&r1), "w1").is_none());
    // By the clock: at 326 w1's and w2's places (320, 325) have lapsed, w3's (330) has not.
    let (RenewOutcome::Renewed(ren), _) = renew(Some(&r), "a", 1000, 326) else {
        panic!()
    };
    assert_eq!((ren.place_of("w3"), ren.queue.len()), (Some(0), 0));
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
        ["w1", "w2", "w3"].map(|t| ren.place_of(t)),
        [Some(0), Some(1), None]
    );
    // A lapsed first place: the next one is served, not the lapsed one.
    let mut stale = super::freed(&r, 40, Expiry::Clock);
    stale.waiter_expires_ms = Some(41);
    let (out, _) = acquire(Current::Record(&stale), &req("w1"), at(50), false);
    assert!(matches!(out, AcquireOutcome::Held(_)));
    let g = granted(acquire(
        Current::Record(&stale),
        &waiting("w2"),
        at(50),
        false,
    ));
    assert_eq!(g.place_of("w3"), Some(0));
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

/// A retry of an acquisition whose grant was written but never answered (same token) is granted
/// again at once, as a renewal in the same write: its lease counts from the retry, as its
/// holder's `valid_until` does, not from the lost grant's (the store would free it first).
#[test]
fn a_retried_grant_is_renewed_from_the_retry() {
    let a = granted(acquire(Current::Missing, &req("a"), at(10), false));
    assert_eq!(a.expires_ms, 1010);
    // Somebody waits meanwhile: the retry is no waiter of its own lease, and the line stays.
    let (_, w) = acquire(Current::Record(&a), &waiting("b"), at(600), false);
    let a = w.expect("b joins the line");
    let again = granted(acquire(Current::Record(&a), &req("a"), at(700), false));
    assert_eq!(
        again.fence, a.fence,
        "the same grant, never handed out before"
    );
    assert_eq!(again.expires_ms, 1700, "counted from the retry");
    assert_eq!(again.renewed_ms, 700);
    assert_eq!(again.acquired_ms, a.acquired_ms);
    assert_eq!(again.waiter_token.as_deref(), Some("b"));
    // Once expired, a retry is a new grant with a new fence.
    let late = granted(acquire(Current::Record(&again), &req("a"), at(1800), false));
    assert!(late.fence > again.fence);
}

/// The release is the grant: the first live waiter in line is made the holder, unclaimed, with
/// the place's remaining time and lifetime; a lapsed first place is skipped; the claim takes a
/// block of fences above the grant's; a withdrawal of the unclaimed grant passes it on.
#[test]
fn a_release_grants_the_first_live_waiter_and_its_claim_takes_it_up() {
    let a = granted(acquire(Current::Missing, &req("a"), at(10), false));
    let mut w1 = waiting("w1");
    w1.waiter_ttl = Some(Duration::from_millis(300));
    let mut w2 = waiting("w2");
    w2.waiter_ttl = Some(Duration::from_millis(400));
    let r = attempt(&a, &w1, 20, Expiry::Clock);
    let r = attempt(&r, &w2, 25, Expiry::Clock);
    // At 30 both places are live: w1 is granted until its place's end (320).
    let (out, g) = release(Some(&r), "a", 30);
    assert_eq!(out, ReleaseOutcome::Released);
    let g = g.unwrap();
    assert_eq!(
        (g.token.as_deref(), g.unclaimed, g.expires_ms, g.ttl_ms),
        (Some("w1"), true, 320, 300)
    );
    assert!(g.fence > a.fence && g.pid.is_none() && g.labels.is_empty());
    assert_eq!(g.place_of("w2"), Some(0), "w2 moved up");
    // At 321 w1's place has lapsed: w2 is granted instead.
    let (_, g2) = release(Some(&r), "a", 321);
    assert_eq!(g2.unwrap().token.as_deref(), Some("w2"));
    // The claim: a block of 3 above the grant's fence, w1's TTL, no longer unclaimed.
    let mut claim = w1.clone();
    claim.fences = 3;
    let c = granted(acquire(Current::Record(&g), &claim, at(40), false));
    assert!(c.fence >= g.fence + 3, "{} < {} + 3", c.fence, g.fence);
    assert!(!c.unclaimed && c.expires_ms == 40 + c.ttl_ms && c.pid.is_some());
    // Withdrawn unclaimed: passed on to w2.
    let passed = withdraw_waiter(Some(&g), "w1").unwrap();
    assert_eq!(passed.token.as_deref(), Some("w2"));
    assert!(passed.unclaimed && passed.fence > g.fence);
    // Nobody in line: free.
    let (_, f) = release(Some(&a), "a", 30);
    assert!(f.unwrap().token.is_none());
}
