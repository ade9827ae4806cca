use super::*;
use crate::decide::tests::{acquire_any, removable};
use crate::decide::Observed;
use crate::key::Key;
use std::time::Duration;

const SEM: PermitRequest = PermitRequest::Semaphore { permits: 2 };

fn req(token: &str, want: PermitRequest) -> AcquireRequest {
    let mut r = AcquireRequest::new(Key::new("k").unwrap(), token, Duration::from_millis(1000));
    r.token = token.into();
    r.permit = Some(want);
    r
}

fn waiting(token: &str, want: PermitRequest) -> AcquireRequest {
    req(token, want).waiter(Duration::from_millis(500))
}

fn at(ms: u64) -> Now {
    Now { ms, us: ms }
}

/// One step on `r` (the stored record, updated when written): the outcome.
fn step(r: &mut Option<LeaseRecord>, q: &AcquireRequest, now: u64) -> AcquireOutcome {
    step_judged(r, q, now, Expiry::Clock)
}

fn step_judged(
    r: &mut Option<LeaseRecord>,
    q: &AcquireRequest,
    now: u64,
    expiry: Expiry,
) -> AcquireOutcome {
    let current = r.as_ref().map_or(Current::Missing, Current::Record);
    let (out, write) =
        acquire_any(current, q, at(now), false, expiry, 0).unwrap_or_else(|e| panic!("{e}"));
    if let Some(w) = write {
        *r = Some(w);
    }
    out
}

fn fence(o: &AcquireOutcome) -> u64 {
    match o {
        AcquireOutcome::Granted(r) => r.fence,
        AcquireOutcome::Held(r) => panic!("held: {r:?}"),
    }
}

fn holders(r: &Option<LeaseRecord>) -> Vec<String> {
    let t = r
        .as_ref()
        .and_then(|r| r.permits.as_ref())
        .expect("a table");
    t.holders.iter().map(|p| p.holder.clone()).collect()
}

#[test]
fn a_semaphore_grants_its_permits_with_rising_fences_and_no_more() {
    let mut r = None;
    let a = fence(&step(&mut r, &req("a", SEM), 10));
    let b = fence(&step(&mut r, &req("b", SEM), 11));
    assert!(b > a);
    let AcquireOutcome::Held(seen) = step(&mut r, &req("c", SEM), 12) else {
        panic!("both permits are held")
    };
    assert_eq!(seen.holder.as_deref(), Some("a, b (2 of 2 permits)"));
    assert_eq!(seen.expires_ms, 1010, "the earliest expiry");
    // The stored record names no lock holder; the table has both.
    let stored = r.clone().unwrap();
    assert!(stored.token.is_none() && stored.fence == b);
    assert_eq!(holders(&r), ["a", "b"]);
    // Released: one permit comes back, with a fence above both.
    let (out, w) = release(&stored, "a", 20, Expiry::Clock);
    assert_eq!(out, ReleaseOutcome::Released);
    r = w;
    let c = fence(&step(&mut r, &req("c", SEM), 21));
    assert!(c > b);
    assert_eq!(holders(&r), ["b", "c"]);
}

#[test]
fn an_expired_permit_comes_back_and_a_retry_of_a_grant_is_the_same_grant() {
    let mut r = None;
    let a = fence(&step(&mut r, &req("a", SEM), 10));
    assert_eq!(
        fence(&step(&mut r, &req("a", SEM), 11)),
        a,
        "answered again"
    );
    fence(&step(&mut r, &req("b", SEM), 500));
    assert!(matches!(
        step(&mut r, &req("c", SEM), 1010),
        AcquireOutcome::Held(_)
    ));
    // a's permit, renewed by its retry at 11, expired at 1011: c takes it.
    fence(&step(&mut r, &req("c", SEM), 1011));
    assert_eq!(holders(&r), ["b", "c"]);
    let stored = r.clone().unwrap();
    let (out, _) = renew(&stored, "a", 1000, 1012, Expiry::Clock);
    assert!(matches!(out, RenewOutcome::Lost(_)), "{out:?}");
    let (out, w) = renew(&stored, "b", 1000, 1012, Expiry::Clock);
    let RenewOutcome::Renewed(view) = out else {
        panic!("b holds one")
    };
    assert_eq!((view.holder.as_deref(), view.expires_ms), (Some("b"), 2012));
    assert!(
        w.unwrap().token.is_none(),
        "the stored form names no lock holder"
    );
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let mut r = None;
    step(&mut r, &req("a", SEM), 10);
    step(&mut r, &req("b", SEM), 10);
    assert!(matches!(
        step(&mut r, &waiting("w1", SEM), 20),
        AcquireOutcome::Held(_)
    ));
    assert!(matches!(
        step(&mut r, &waiting("w2", SEM), 21),
        AcquireOutcome::Held(_)
    ));
    let (_, w) = release(r.as_ref().unwrap(), "a", 30, Expiry::Clock);
    r = w;
    // One permit free: reserved for the first in line, not for a newcomer or the second.
    assert!(matches!(
        step(&mut r, &req("x", SEM), 31),
        AcquireOutcome::Held(_)
    ));
    assert!(matches!(
        step(&mut r, &waiting("w2", SEM), 31),
        AcquireOutcome::Held(_)
    ));
    fence(&step(&mut r, &waiting("w1", SEM), 32));
    let (_, w) = release(r.as_ref().unwrap(), "b", 40, Expiry::Clock);
    r = w;
    fence(&step(&mut r, &waiting("w2", SEM), 41));
    assert_eq!(holders(&r), ["w1", "w2"]);
    assert!(r.unwrap().waiter_token.is_none(), "the line is empty");
}

#[test]
fn a_key_keeps_its_kind_while_used_and_takes_another_when_unused() {
    let mut r = None;
    step(&mut r, &req("a", SEM), 10);
    let stored = r.clone().unwrap();
    let other = req("b", PermitRequest::Semaphore { permits: 3 });
    let err = acquire_any(
        Current::Record(&stored),
        &other,
        at(11),
        false,
        Expiry::Clock,
        0,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("k is a semaphore of 2 permits"),
        "{err}"
    );
    let mut lock = req("l", SEM);
    lock.permit = None;
    let err = acquire_any(
        Current::Record(&stored),
        &lock,
        at(11),
        false,
        Expiry::Clock,
        0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("asked for as a lock"), "{err}");
    // Once free, the key becomes what it is asked as, and its fences go on rising.
    let (_, w) = release(&stored, "a", 20, Expiry::Clock);
    r = w;
    let before = r.as_ref().unwrap().fence;
    let (out, w) = acquire_any(
        Current::Record(r.as_ref().unwrap()),
        &lock,
        at(21),
        false,
        Expiry::Clock,
        0,
    )
    .unwrap();
    let w = w.unwrap();
    assert!(w.permits.is_none() && fence(&out) > before);
    // A semaphore request on a held lock is refused.
    let err = acquire_any(
        Current::Record(&w),
        &req("s", SEM),
        at(22),
        false,
        Expiry::Clock,
        0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("k is a lock"), "{err}");
}

#[test]
fn readers_share_a_writer_is_alone_and_a_waiting_writer_blocks_new_readers() {
    use PermitRequest::{Read, Write};
    let mut r = None;
    let r1 = fence(&step(&mut r, &req("r1", Read), 10));
    let r2 = fence(&step(&mut r, &req("r2", Read), 11));
    assert!(matches!(
        step(&mut r, &waiting("w", Write), 12),
        AcquireOutcome::Held(_)
    ));
    // A reader after the waiting writer waits too.
    let AcquireOutcome::Held(seen) = step(&mut r, &req("r3", Read), 13) else {
        panic!("a writer waits ahead")
    };
    assert_eq!(seen.holder.as_deref(), Some("r1, r2 (reading)"));
    for t in ["r1", "r2"] {
        let (_, w) = release(r.as_ref().unwrap(), t, 20, Expiry::Clock);
        r = w;
    }
    let w = fence(&step(&mut r, &waiting("w", Write), 21));
    assert!(w > r1.max(r2), "the write is fenced above the reads");
    assert!(r
        .as_ref()
        .unwrap()
        .permits
        .as_ref()
        .unwrap()
        .writers_waiting
        .is_empty());
    let AcquireOutcome::Held(seen) = step(&mut r, &req("r3", Read), 22) else {
        panic!("the writer holds it")
    };
    assert_eq!(seen.holder.as_deref(), Some("w (writing)"));
    assert!(matches!(
        step(&mut r, &req("w2", Write), 22),
        AcquireOutcome::Held(_)
    ));
    let (_, x) = release(r.as_ref().unwrap(), "w", 30, Expiry::Clock);
    r = x;
    assert!(fence(&step(&mut r, &req("r3", Read), 31)) > w);
}

#[test]
fn a_withdrawn_writer_no_longer_blocks_readers() {
    use PermitRequest::{Read, Write};
    let mut r = None;
    step(&mut r, &req("r1", Read), 10);
    step(&mut r, &waiting("w", Write), 11);
    assert!(matches!(
        step(&mut r, &req("r2", Read), 12),
        AcquireOutcome::Held(_)
    ));
    r = crate::decide::tests::withdraw_waiter(r.as_ref(), "w");
    assert!(r
        .as_ref()
        .unwrap()
        .permits
        .as_ref()
        .unwrap()
        .writers_waiting
        .is_empty());
    fence(&step(&mut r, &req("r2", Read), 13));
}

#[test]
fn observed_permits_lapse_by_their_own_observation() {
    let mut r = None;
    step(&mut r, &req("a", SEM), 10);
    step(&mut r, &req("b", SEM), 10);
    let seen = |permits_lapsed| {
        Expiry::Observed(Observed {
            lease_unchanged: Duration::ZERO,
            waiter_unchanged: Duration::ZERO,
            max_skew: Duration::MAX,
            queue_lapsed: 0,
            permits_lapsed,
        })
    };
    // Written expiries long past on this clock count for nothing without the skew shortcut.
    let mut copy = r.clone();
    assert!(matches!(
        step_judged(&mut copy, &req("c", SEM), 1_000_000, seen(0)),
        AcquireOutcome::Held(_)
    ));
    // b (entry 1) seen unchanged for its TTL: its permit comes free, a's does not.
    fence(&step_judged(&mut r, &req("c", SEM), 1_000_000, seen(0b10)));
    assert_eq!(holders(&r), ["a", "c"]);
}

#[test]
fn an_operator_frees_one_holder_or_all() {
    let mut r = None;
    step(&mut r, &req("a", SEM), 10);
    step(&mut r, &req("b", SEM), 10);
    let stored = r.unwrap();
    assert!(force_freed(&stored, Some("nobody"), 20, Expiry::Clock).is_none());
    let one = force_freed(&stored, Some("a"), 20, Expiry::Clock).unwrap();
    assert_eq!(holders(&Some(one)), ["b"]);
    let all = force_freed(&stored, None, 20, Expiry::Clock).unwrap();
    assert!(holders(&Some(all)).is_empty());
    assert!(!removable(&stored, 20, 0));
}

#[test]
fn counts_out_of_range_are_refused() {
    for permits in [0, PERMIT_LIMIT + 1] {
        let q = req("a", PermitRequest::Semaphore { permits });
        let err = acquire_any(Current::Missing, &q, at(1), false, Expiry::Clock, 0).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    name: "permits",
                    ..
                }
            ),
            "{err}"
        );
    }
}

/// A retried permit acquisition (same token) whose grant was written but never answered is
/// granted again as a renewal in the same write: the permit counts from the retry, never from
/// the lost grant, and keeps its fence.
#[test]
fn a_retried_permit_grant_is_renewed_from_the_retry() {
    let mut r = None;
    let a = fence(&step(&mut r, &req("a", SEM), 10));
    let AcquireOutcome::Granted(seen) = step(&mut r, &req("a", SEM), 700) else {
        panic!("ours already")
    };
    assert_eq!(
        (seen.fence, seen.expires_ms, seen.renewed_ms),
        (a, 1700, 700)
    );
    let stored = r.clone().unwrap();
    let t = stored.permits.as_ref().expect("a table");
    assert_eq!(t.holders.len(), 1, "one permit, not two");
    assert_eq!(t.holders[0].expires_ms, 1700, "written");
    // Past its expiry the permit lapsed: a retry then is a new grant.
    let b = fence(&step(&mut r, &req("a", SEM), 1800));
    assert!(b > a);
}
