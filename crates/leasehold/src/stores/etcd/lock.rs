//! The lock path on etcd: a lease is the record key `<prefix>lock/<key>`, created by one
//! transaction.
//!
//! Each attempt is read → plan → one transaction → answer:
//!
//! 1. **transaction** ([`grant_txn`], pure): put the record, attached to its session, if the
//!    record key is absent, no permit key is under the key's permit prefix, and the waiter key
//!    is absent, or is ours as read (the grant deletes it); else read everything of the key
//!    ([`state_ops`]). A failed grant is so the next attempt's **read**; the first attempt goes
//!    without one (the likely case: the key is free, and ours if we are its waiter).
//! 2. **plan** ([`plan`], pure): what that read says: a permit key (refused), reserved for us
//!    (try again as its waiter), reserved for another or held (answer held, after registering
//!    as its waiter when asked), or free again (try again).
//! 3. **answer**: granted, or held; a held key's waiter registration is one transaction more
//!    ([`EtcdStore::register`]), compared against the holder's create revision as read.
//!
//! The rules are `decide`'s `acquire` step with etcd's one registered waiter for the line (no
//! place in line: [`Capabilities::waiter_line`](crate::store::Capabilities) is false).

use super::read::{state_ops, Kv, Names, State};
use super::{fence_of, lock_record, parse_waiter, permits, revision, EtcdStore, Waiter};
use super::{Inner, FENCE_STRIDE};
use crate::decide::mismatch;
use crate::error::{Error, Result};
use crate::record::{now_ms, LeaseRecord};
use crate::store::{AcquireOutcome, AcquireRequest};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::time::Instant;

/// Attempts before an acquisition whose key keeps changing fails, retryably.
const ATTEMPTS: usize = 4;

/// What a failed grant's read says to do.
#[derive(Debug)]
pub(super) enum Plan {
    /// Try again: as the waiter the key is reserved for (its registration's create revision), or
    /// as none (the key was freed meanwhile).
    Retry(Option<i64>),
    /// Held, by no lease: reserved for another waiter, or by an unreadable registration.
    Held(LeaseRecord),
    /// Held by the lease in `lock` (its record `record`, the waiter `waiter` as read), then
    /// `wait` as its waiter.
    Taken {
        lock: Kv,
        record: LeaseRecord,
        waiter: Option<Waiter>,
        wait: Wait,
    },
}

/// What a caller that finds the key held does about its waiter registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Registers as the waiter, for this long (nobody is registered).
    Register(Duration),
    /// Keeps its own registration for this long.
    Extend(Duration),
    /// Nothing: it asked for no registration, or another waiter is registered.
    No,
}

/// The grant's transaction for the record key `n.lock` (its put `put`), as the waiter whose
/// registration was created at `mine` (none: no waiter may be registered); its else branch reads
/// everything of the key.
pub(super) fn grant_txn(n: &Names, put: TxnOp, mine: Option<i64>) -> Txn {
    let mut when = vec![
        Compare::create_revision(n.lock.clone(), CompareOp::Equal, 0),
        // No permit held: the key is not a semaphore or read-write lock now.
        Compare::create_revision(n.prefix.clone(), CompareOp::Equal, 0).with_prefix(),
    ];
    let mut then = vec![put];
    match mine {
        Some(rev) => {
            when.push(Compare::create_revision(
                n.waiter.clone(),
                CompareOp::Equal,
                rev,
            ));
            then.push(TxnOp::delete(n.waiter.clone(), None));
        }
        None => when.push(Compare::create_revision(
            n.waiter.clone(),
            CompareOp::Equal,
            0,
        )),
    }
    Txn::new().when(when).and_then(then).or_else(state_ops(n))
}

/// A record held by someone this store cannot name (`who`), until `ttl` from now at least.
fn unknown(key: &str, who: &str, ttl: Duration) -> LeaseRecord {
    let mut r = LeaseRecord::free(key, 0);
    r.holder = Some(format!("unknown ({who})"));
    r.token = Some(String::new());
    r.expires_ms = now_ms() + crate::record::ms(ttl);
    r
}

/// The plan for `req` on the key as a failed grant read it (`st`).
///
/// # Errors
/// [`Error::InvalidOption`] (`permits`) when the key is a semaphore or read-write lock, held or
/// waited for as one.
pub(super) fn plan(req: &AcquireRequest, st: State) -> Result<Plan> {
    let key = req.key.as_str();
    let waiter = parse_waiter(st.waiter.as_ref());
    if st.lock.is_none() && !st.slots.is_empty() {
        let rec = permits::record_of(key, &st, None);
        let is = rec.permits.map(|t| t.kind.to_string()).unwrap_or_default();
        return Err(mismatch(key, &is, "a lock"));
    }
    if let Some(wr) = waiter.as_ref().filter(|wr| wr.permit.is_some()) {
        return Err(mismatch(key, &permits::waiter_is(wr), "a lock"));
    }
    let Some(lock) = st.lock else {
        // Free: reserved for a waiter (us, or another), or the race moved on.
        return Ok(match (&waiter, &st.waiter) {
            (Some(wr), Some(kv)) if wr.waiter_token == req.token => {
                Plan::Retry(Some(kv.create_revision()))
            }
            (Some(_), _) => {
                let mut free = LeaseRecord::free(key, 0);
                EtcdStore::with_waiter(&mut free, waiter.as_ref());
                Plan::Held(free)
            }
            // Held by it until its session ends.
            (None, Some(_)) => {
                Plan::Held(unknown(key, "an unreadable waiter registration", req.ttl))
            }
            (None, None) => Plan::Retry(None),
        });
    };
    let record = lock_record(key, &lock)
        .unwrap_or_else(|_| unknown(key, "a value that is not a leasehold record", req.ttl));
    let wait = match (req.waiter_ttl, &waiter) {
        (Some(wttl), None) => Wait::Register(wttl),
        (Some(wttl), Some(wr)) if wr.waiter_token == req.token => Wait::Extend(wttl),
        _ => Wait::No,
    };
    Ok(Plan::Taken {
        lock,
        record,
        waiter,
        wait,
    })
}

impl EtcdStore {
    /// Acquires a lock (`req.permit` is `None`).
    pub(super) async fn acquire_lock(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        if req.fences >= FENCE_STRIDE {
            return Err(Error::InvalidOption {
                name: "fences",
                reason: format!("at most {} per grant on etcd", FENCE_STRIDE - 1),
            });
        }
        let n = self.names(&req.key);
        let (rec, value) = self.grant_record(req)?;
        let session = self.inner.sessions.for_ttl(req.ttl).await?;
        let put = TxnOp::put(
            n.lock.clone(),
            value.clone(),
            Some(PutOptions::new().with_lease(session.id)),
        );
        let mut mine = self
            .inner
            .held
            .get(&n.waiter, &req.token)
            .map(|e| e.create_rev);
        for _ in 0..ATTEMPTS {
            if req.given_up.is_given_up() {
                return Err(Error::GivenUp {
                    key: req.key.as_str().to_owned(),
                });
            }
            let sent = Instant::now();
            let answer = self.txn(grant_txn(&n, put.clone(), mine)).await;
            let r = match answer {
                Ok(r) => r,
                Err(e) => {
                    // It may have been granted: a retry of this acquisition may adopt it
                    // (`own_unanswered`) until its TTL passes; then it is deleted, never adopted.
                    let at = sent + req.ttl;
                    self.inner
                        .held
                        .unanswered(&n.lock, &req.token, value, at, session);
                    return Err(e);
                }
            };
            if r.succeeded() {
                let rev = revision(&r);
                self.inner.held.remove(&n.waiter, &req.token);
                self.inner
                    .held
                    .insert(&n.lock, &req.token, rev, session, sent + req.ttl);
                let mut rec = rec;
                rec.fence = fence_of(rev, req.fences.max(1));
                rec.store.clear();
                return Ok(AcquireOutcome::Granted(rec));
            }
            match plan(req, super::read::parse_state(r))? {
                Plan::Retry(as_waiter) => mine = as_waiter,
                Plan::Held(free) => return Ok(AcquireOutcome::Held(free)),
                Plan::Taken {
                    lock,
                    record,
                    waiter,
                    wait,
                } => {
                    if let Some(own) = self.own_unanswered(req, &lock, &session) {
                        return Ok(AcquireOutcome::Granted(own));
                    }
                    return self.wait_for(req, &n, &lock, record, waiter, wait).await;
                }
            }
        }
        Err(changed(&self.inner, req))
    }

    /// The answer to `req` on a key held by `lock` (its record `held`, its waiter `waiter` as
    /// read), after registering as its waiter or keeping our registration (`wait`).
    async fn wait_for(
        &self,
        req: &AcquireRequest,
        n: &Names,
        lock: &Kv,
        mut held: LeaseRecord,
        waiter: Option<Waiter>,
        wait: Wait,
    ) -> Result<AcquireOutcome> {
        match wait {
            Wait::Register(wttl) => {
                let holder = Compare::create_revision(
                    n.lock.clone(),
                    CompareOp::Equal,
                    lock.create_revision(),
                );
                if self.register(req, wttl, vec![holder], None).await? {
                    let ours = Waiter {
                        waiter: req.holder.clone(),
                        waiter_token: req.token.clone(),
                        waiter_ttl_ms: crate::record::ms(wttl),
                        write: 0,
                        permit: None,
                    };
                    Self::with_waiter(&mut held, Some(&ours));
                    return Ok(AcquireOutcome::Held(held));
                }
            }
            Wait::Extend(wttl) => {
                self.inner
                    .held
                    .extend(&n.waiter, &req.token, Instant::now() + wttl, None);
            }
            Wait::No => {}
        }
        Self::with_waiter(&mut held, waiter.as_ref());
        Ok(AcquireOutcome::Held(held))
    }
}

/// The error of an acquisition whose key changed under every attempt.
fn changed(inner: &Inner, req: &AcquireRequest) -> Error {
    Error::Store {
        store: inner.described.clone(),
        detail: format!(
            "the key {} changed under four attempts in a row",
            req.key.as_str()
        ),
        retryable: true,
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    fn req(holder: &str) -> AcquireRequest {
        let key = Key::new("k").expect("a key");
        let mut r = AcquireRequest::new(key, holder, Duration::from_secs(10));
        r.token = format!("{holder}-token");
        r
    }

    fn record_kv(holder: &str, rev: i64) -> Kv {
        let mut rec = LeaseRecord::free("k", 0);
        rec.holder = Some(holder.into());
        rec.token = Some(format!("{holder}-token"));
        rec.ttl_ms = 10_000;
        let value = serde_json::to_vec(&rec).expect("json");
        Kv::new("p/lock/k", value, rev, rev, 7)
    }

    fn waiter_kv(holder: &str, rev: i64, permit: Option<&str>) -> Kv {
        let w = Waiter {
            waiter: holder.into(),
            waiter_token: format!("{holder}-token"),
            waiter_ttl_ms: 5_000,
            write: 1,
            permit: permit.map(str::to_owned),
        };
        Kv::new(
            "p/waiter/k",
            serde_json::to_vec(&w).expect("json"),
            rev,
            rev,
            8,
        )
    }

    #[test]
    fn a_key_reserved_for_us_is_tried_again_as_its_waiter() {
        let st = State {
            waiter: Some(waiter_kv("a", 42, None)),
            ..State::default()
        };
        assert!(matches!(plan(&req("a"), st), Ok(Plan::Retry(Some(42)))));
        assert!(matches!(
            plan(&req("a"), State::default()),
            Ok(Plan::Retry(None))
        ));
    }

    #[test]
    fn a_key_reserved_for_another_is_held_by_nobody_with_that_waiter() {
        let st = State {
            waiter: Some(waiter_kv("b", 42, None)),
            ..State::default()
        };
        let Ok(Plan::Held(free)) = plan(&req("a"), st) else {
            panic!("not held");
        };
        assert_eq!(free.holder, None);
        assert_eq!(free.waiter.as_deref(), Some("b"));
        let st = State {
            waiter: Some(Kv::new("p/waiter/k", "garbage", 3, 3, 8)),
            ..State::default()
        };
        let Ok(Plan::Held(r)) = plan(&req("a"), st) else {
            panic!("not held");
        };
        assert!(r.holder.is_some_and(|h| h.starts_with("unknown")));
    }

    #[test]
    fn a_held_key_registers_a_waiter_only_when_nobody_is() {
        let held = |waiter| State {
            lock: Some(record_kv("b", 9)),
            waiter,
            ..State::default()
        };
        let mut r = req("a");
        let Ok(Plan::Taken { record, wait, .. }) = plan(&r, held(None)) else {
            panic!("not taken");
        };
        assert_eq!(record.holder.as_deref(), Some("b"));
        assert_eq!(record.fence, 9 * FENCE_STRIDE);
        assert_eq!(wait, Wait::No);
        r.waiter_ttl = Some(Duration::from_secs(5));
        let Ok(Plan::Taken { wait, .. }) = plan(&r, held(None)) else {
            panic!("not taken");
        };
        assert_eq!(wait, Wait::Register(Duration::from_secs(5)));
        let Ok(Plan::Taken { wait, .. }) = plan(&r, held(Some(waiter_kv("a", 10, None)))) else {
            panic!("not taken");
        };
        assert_eq!(wait, Wait::Extend(Duration::from_secs(5)));
        let Ok(Plan::Taken { wait, waiter, .. }) = plan(&r, held(Some(waiter_kv("c", 10, None))))
        else {
            panic!("not taken");
        };
        assert_eq!(wait, Wait::No);
        assert_eq!(waiter.map(|w| w.waiter), Some("c".to_owned()));
    }

    #[test]
    fn a_permit_key_refuses_a_lock() {
        let st = State {
            waiter: Some(waiter_kv("b", 4, Some("write"))),
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a"), st),
            Err(Error::InvalidOption { .. })
        ));
        let st = State {
            slots: vec![Kv::new("p/permit/k\0w", "{}", 5, 5, 7)],
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a"), st),
            Err(Error::InvalidOption { .. })
        ));
    }

    #[test]
    fn an_unreadable_record_is_held_by_an_unknown_holder() {
        let st = State {
            lock: Some(Kv::new("p/lock/k", "not json", 3, 3, 7)),
            ..State::default()
        };
        let Ok(Plan::Taken { record, .. }) = plan(&req("a"), st) else {
            panic!("not taken");
        };
        assert!(record.holder.is_some_and(|h| h.starts_with("unknown")));
    }
}
