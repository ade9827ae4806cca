//! Semaphores and read-write locks ([`AcquireRequest::permit`]) on etcd: a key per holder under
//! the key's permit prefix, the count checked by the grant's transaction.
//!
//! * A permit of key `K` is the etcd key `<prefix>permit/K\0<slot>` (`\0` cannot be in a
//!   [`Key`], so no other key's permits share the prefix): slots `0 ..= n−1` for a semaphore of
//!   `n`, `0 ..= 63` for readers, `w` for a writer. A grant creates one slot compared absent,
//!   so a semaphore never has more than `n` holders whatever races; a writer's grant compares
//!   the whole prefix empty, a reader's the `w` slot absent. The value is the [`Permit`] (JSON),
//!   attached to the session lease of its TTL class and held like a lock key ([`Held`]): renewed
//!   by reading it, deleted at its own deadline, freed with its session.
//! * Its fence is its slot key's create revision × 65536, like a lock's: above every fence the
//!   cluster issued before it, locks, permits, reads and writes alike.
//! * `<prefix>kind/K` says what the key is (`semaphore:N` or `read-write`); every grant compares
//!   it unchanged. A request of another kind is refused while a permit, the lock or a waiter
//!   exists ([`crate::decide::mismatch`]); else the grant replaces it, comparing the permit
//!   prefix empty. A lock's grant compares the permit prefix empty too.
//! * The key's one waiter (`<prefix>waiter/K`) names the kind it waits as. A registered waiter
//!   is ahead of every other request: a semaphore or reader grant beside it must leave a slot
//!   for it (it compares a second slot free), a writer waits for it, and a waiting writer stops
//!   new readers (their grants compare the waiter key as read).
//!
//! [`Held`]: super::held::Held

use super::read::{gets, parse_state, state_ops, Kv, Names, State};
use super::{fence_of, parse_waiter, revision, session, EtcdStore, Waiter};
use crate::decide::{held_view, mismatch, view};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::{now_ms, LeaseRecord, Permit, PermitKind, Permits, PERMIT_LIMIT};
use crate::store::{AcquireOutcome, AcquireRequest, LockStore, PermitRequest};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::time::Instant;

/// The slot of a read-write lock's writer.
const WRITER: &str = "w";

/// A permit as stored: the permit (its fence comes from the create revision) and a number that
/// makes the value name one write ([`super::held::next_write`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Slot {
    #[serde(flatten)]
    permit: Permit,
    #[serde(default)]
    once: u64,
}

/// What the kind key says, as stored.
pub(super) fn kind_value(kind: PermitKind) -> String {
    match kind {
        PermitKind::Semaphore { permits } => format!("semaphore:{permits}"),
        PermitKind::ReadWrite => "read-write".into(),
    }
}

fn parse_kind(v: &[u8]) -> Option<PermitKind> {
    match std::str::from_utf8(v).ok()? {
        "read-write" => Some(PermitKind::ReadWrite),
        s => Some(PermitKind::Semaphore {
            permits: s.strip_prefix("semaphore:")?.parse().ok()?,
        }),
    }
}

/// What a waiter waits as, as its registration says it.
pub(super) fn waiter_kind(want: PermitRequest) -> String {
    match want {
        PermitRequest::Semaphore { permits } => format!("semaphore:{permits}"),
        PermitRequest::Read => "read".into(),
        PermitRequest::Write => "write".into(),
    }
}

/// A registration's kind in words (a lock's has none).
pub(super) fn waiter_is(w: &Waiter) -> String {
    match w.permit.as_deref() {
        None => "a lock".into(),
        Some("read" | "write") => PermitKind::ReadWrite.to_string(),
        Some(s) => s
            .strip_prefix("semaphore:")
            .and_then(|n| n.parse().ok())
            .map_or_else(
                || "of an unknown kind".into(),
                |permits| PermitKind::Semaphore { permits }.to_string(),
            ),
    }
}

/// The slot name of a permit key of `n`.
fn slot_of<'a>(n: &Names, kv: &'a Kv) -> &'a str {
    let name = kv.key_str().unwrap_or_default();
    name.get(n.prefix.len()..).unwrap_or_default()
}

/// The permit in `kv`, with its fence and its expiry at least its TTL from now (it exists, so
/// its holder keeps it).
fn permit_of(kv: &Kv) -> Option<Permit> {
    let s: Slot = serde_json::from_slice(kv.value()).ok()?;
    let mut p = s.permit;
    p.fence = fence_of(kv.create_revision(), 1);
    p.expires_ms = p.expires_ms.max(now_ms() + p.ttl_ms);
    Some(p)
}

/// The record of a permit key as `st` shows it, as the record stores keep it: every holder in
/// its table (in grant order), the waiter; no holder in the lock fields.
pub(super) fn record_of(key: &str, st: &State, kind: Option<PermitKind>) -> LeaseRecord {
    let mut slots: Vec<&Kv> = st.slots.iter().collect();
    slots.sort_by_key(|kv| kv.create_revision());
    let holders: Vec<Permit> = slots
        .iter()
        .map(|kv| {
            permit_of(kv).unwrap_or_else(|| Permit {
                holder: "unknown (a value that is not a leasehold permit)".into(),
                token: String::new(),
                fence: fence_of(kv.create_revision(), 1),
                write: false,
                acquired_ms: 0,
                renewed_ms: 0,
                expires_ms: now_ms(),
                ttl_ms: 0,
                pid: None,
                host: None,
                labels: Default::default(),
            })
        })
        .collect();
    let fence = holders.iter().map(|p| p.fence).max().unwrap_or(0);
    let mut r = LeaseRecord::free(key, fence);
    let waiter = parse_waiter(st.waiter.as_ref());
    let kind = kind
        .or_else(|| st.kind.as_ref().and_then(|k| parse_kind(k.value())))
        .unwrap_or(PermitKind::ReadWrite);
    let mut t = Permits::new(kind);
    t.holders = holders;
    if let Some(w) = waiter
        .as_ref()
        .filter(|w| w.permit.as_deref() == Some("write"))
    {
        t.writers_waiting.push(w.waiter_token.clone());
    }
    r.permits = Some(t);
    EtcdStore::with_waiter(&mut r, waiter.as_ref());
    r
}

/// What one grant attempt compares and writes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    slot: String,
    /// A slot left free for the registered waiter.
    also_free: Option<String>,
    /// The kind key replaced (it compares the permit prefix empty).
    replace: bool,
    /// The kind key's mod revision as read (`None`: compare its value instead).
    kind_mod: Option<i64>,
    /// The waiter key's create revision as read (0: none; ours is deleted by the grant).
    waiter_rev: i64,
    waiter_mine: bool,
}

/// What a read of the key says to do.
#[derive(Debug)]
pub(super) enum Step {
    Try(Plan),
    /// The permit at `kv` is ours already (an answer lost on the way): granted if it is still
    /// on our session and the session vouches for it, else held; `rec` the key's record.
    Ours {
        kv: Kv,
        rec: LeaseRecord,
    },
    /// Not grantable now: register as waiter (when asked) and answer this record.
    Wait(LeaseRecord, Option<Waiter>),
}

/// The first attempt's plan, without a read: the likely case, the key of this kind, nobody
/// waiting (but us, registered at `mine`), and a slot picked at random free (of a read-write
/// lock's 64 reader slots, most are).
pub(super) fn guess(want: PermitRequest, mine: Option<i64>) -> Plan {
    let slot = match want {
        PermitRequest::Write => WRITER.to_owned(),
        PermitRequest::Read => fastrand::u32(..PERMIT_LIMIT).to_string(),
        PermitRequest::Semaphore { permits } => fastrand::u32(..permits.max(1)).to_string(),
    };
    Plan {
        slot,
        also_free: None,
        replace: false,
        kind_mod: None,
        waiter_rev: mine.unwrap_or(0),
        waiter_mine: mine.is_some(),
    }
}

/// The rules of `decide`'s permit `acquire` step on the key as read (`st`, the names `n`).
///
/// # Errors
/// [`Error::InvalidOption`] (`permits`) when the key is of another kind, or a lock.
pub(super) fn plan(
    req: &AcquireRequest,
    want: PermitRequest,
    n: &Names,
    st: &State,
) -> Result<Step> {
    let key = req.key.as_str();
    let asked = crate::decide::asked(req);
    if st.lock.is_some() {
        return Err(mismatch(key, "a lock", &asked));
    }
    let kind = want.kind();
    let waiter = parse_waiter(st.waiter.as_ref());
    if st.waiter.is_some() && waiter.is_none() {
        // An unreadable registration: waited for until its session ends.
        let mut r = record_of(key, st, Some(kind));
        r.waiter = Some("unknown (an unreadable waiter registration)".into());
        r.waiter_token = Some(String::new());
        return Ok(Step::Wait(r, None));
    }
    let stored = st.kind.as_ref().and_then(|k| parse_kind(k.value()));
    if !st.slots.is_empty() && stored != Some(kind) {
        let is = stored.map_or_else(|| "of an unknown kind".into(), |k| k.to_string());
        return Err(mismatch(key, &is, &asked));
    }
    if let Some(w) = &waiter {
        let is = waiter_is(w);
        if is != kind.to_string() {
            return Err(mismatch(key, &is, &asked));
        }
    }
    if let Some(kv) = st
        .slots
        .iter()
        .find(|kv| permit_of(kv).is_some_and(|p| p.token == req.token))
    {
        let rec = record_of(key, st, Some(kind));
        return Ok(Step::Ours {
            kv: kv.clone(),
            rec,
        });
    }
    let mine = waiter.as_ref().is_some_and(|w| w.waiter_token == req.token);
    let ahead = usize::from(waiter.is_some() && !mine);
    let writer_ahead = ahead == 1
        && waiter
            .as_ref()
            .is_some_and(|w| w.permit.as_deref() == Some("write"));
    let taken: Vec<&str> = st.slots.iter().map(|kv| slot_of(n, kv)).collect();
    let held = taken.len();
    let free = |count: u32| {
        let mut f: Vec<String> = (0..count)
            .map(|i| i.to_string())
            .filter(|s| !taken.contains(&s.as_str()))
            .collect();
        fastrand::shuffle(&mut f);
        f
    };
    let (grantable, free) = match want {
        PermitRequest::Write => (held == 0 && ahead == 0, vec![WRITER.to_owned()]),
        PermitRequest::Read => (
            !taken.contains(&WRITER) && !writer_ahead && held + ahead < PERMIT_LIMIT as usize,
            free(PERMIT_LIMIT),
        ),
        PermitRequest::Semaphore { permits } => (held + ahead < permits as usize, free(permits)),
    };
    if !grantable || free.len() <= ahead {
        return Ok(Step::Wait(record_of(key, st, Some(kind)), waiter));
    }
    let mut free = free.into_iter();
    let (Some(slot), also_free) = (free.next(), free.next().filter(|_| ahead == 1)) else {
        return Ok(Step::Wait(record_of(key, st, Some(kind)), waiter));
    };
    Ok(Step::Try(Plan {
        slot,
        also_free,
        replace: stored != Some(kind),
        kind_mod: Some(st.kind.as_ref().map_or(0, |k| k.mod_revision())),
        waiter_rev: st.waiter.as_ref().map_or(0, |w| w.create_revision()),
        waiter_mine: mine,
    }))
}

/// The grant's transaction of `plan` for `want` on the key named `n`, its permit written by
/// `put`: the permit's slot key and the key's state compared as planned; the state read back
/// either way.
pub(super) fn grant_txn(n: &Names, want: PermitRequest, plan: &Plan, put: TxnOp) -> Txn {
    let mut when = vec![
        Compare::create_revision(n.lock.clone(), CompareOp::Equal, 0),
        Compare::create_revision(n.waiter.clone(), CompareOp::Equal, plan.waiter_rev),
        Compare::create_revision(n.slot(&plan.slot), CompareOp::Equal, 0),
    ];
    match plan.kind_mod {
        None => when.push(Compare::value(
            n.kind.clone(),
            CompareOp::Equal,
            kind_value(want.kind()),
        )),
        Some(m) => when.push(Compare::mod_revision(n.kind.clone(), CompareOp::Equal, m)),
    }
    let empty = || Compare::create_revision(n.prefix.clone(), CompareOp::Equal, 0).with_prefix();
    match want {
        PermitRequest::Write => when.push(empty()),
        PermitRequest::Read => when.push(Compare::create_revision(
            n.slot(WRITER),
            CompareOp::Equal,
            0,
        )),
        PermitRequest::Semaphore { .. } => {}
    }
    if plan.replace {
        when.push(empty());
    }
    if let Some(other) = &plan.also_free {
        when.push(Compare::create_revision(n.slot(other), CompareOp::Equal, 0));
    }
    let mut then = vec![put];
    if plan.waiter_mine {
        then.push(TxnOp::delete(n.waiter.clone(), None));
    }
    if plan.replace {
        then.push(TxnOp::put(n.kind.clone(), kind_value(want.kind()), None));
    }
    then.extend(state_ops(n));
    Txn::new().when(when).and_then(then).or_else(state_ops(n))
}

/// The stored value of the permit `req` asks for (`want`).
fn permit_value(req: &AcquireRequest, want: PermitRequest) -> Result<Vec<u8>> {
    let now = now_ms();
    let ttl_ms = crate::record::ms(req.ttl);
    let permit = Permit {
        holder: req.holder.clone(),
        token: req.token.clone(),
        fence: 0,
        write: want.write(),
        acquired_ms: now,
        renewed_ms: now,
        expires_ms: now.saturating_add(ttl_ms),
        ttl_ms,
        pid: Some(crate::holder::pid()),
        host: Some(crate::holder::host().to_owned()),
        labels: req.labels.clone(),
    };
    serde_json::to_vec(&Slot {
        permit,
        once: super::held::next_write(),
    })
    .map_err(|e| Error::InvalidOption {
        name: "labels",
        reason: format!("cannot be written as JSON: {e}"),
    })
}

impl EtcdStore {
    /// Acquires a permit (`req.permit` is `want`): read (none at first, see [`guess`]) → plan
    /// ([`plan`]) → the grant's transaction ([`grant_txn`], whose answer is the next read) →
    /// answer.
    pub(super) async fn acquire_permit(
        &self,
        req: &AcquireRequest,
        want: PermitRequest,
    ) -> Result<AcquireOutcome> {
        want.validate()?;
        req.check_size(super::options::LABEL_LIMIT, &self.describe())?;
        let n = self.names(&req.key);
        let value = permit_value(req, want)?;
        let session = self.inner.sessions.for_ttl(req.ttl).await?;
        let mut seen: Option<State> = None;
        for _ in 0..16 {
            if req.given_up.is_given_up() {
                return Err(Error::GivenUp {
                    key: req.key.as_str().to_owned(),
                });
            }
            if seen.is_none() && self.inner.held.unanswered_under(&n.prefix, &req.token) {
                // An earlier attempt's write may have landed in any slot: look before writing.
                seen = Some(self.read_state(&n).await?);
            }
            let plan = match &seen {
                None => {
                    let mine = self.inner.held.get(&n.waiter, &req.token);
                    guess(want, mine.map(|e| e.create_rev))
                }
                Some(st) => match plan(req, want, &n, st)? {
                    Step::Try(p) => p,
                    Step::Ours { kv, rec } => {
                        return Ok(self.own_permit(req, &n, &kv, &rec, &session))
                    }
                    Step::Wait(rec, waiter) => {
                        return self.wait_for_permit(req, want, &n, st, rec, waiter).await
                    }
                },
            };
            let slot = n.slot(&plan.slot);
            let put = TxnOp::put(
                slot.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(session.id)),
            );
            let sent = Instant::now();
            let r = match self.txn(grant_txn(&n, want, &plan, put)).await {
                Ok(r) => r,
                Err(e) => {
                    let at = sent + req.ttl;
                    self.inner
                        .held
                        .unanswered(&slot, &req.token, value, at, session);
                    return Err(e);
                }
            };
            if r.succeeded() {
                let rev = revision(&r);
                if plan.waiter_mine {
                    self.inner.held.remove(&n.waiter, &req.token);
                }
                self.inner
                    .held
                    .insert(&slot, &req.token, rev, session, sent + req.ttl);
                let st = parse_state(r);
                let rec = record_of(req.key.as_str(), &st, Some(want.kind()));
                return Ok(AcquireOutcome::Granted(view(&rec, &req.token)));
            }
            seen = Some(parse_state(r));
        }
        Err(Error::Store {
            store: self.inner.described.clone(),
            detail: format!(
                "the permits of {} changed under sixteen attempts in a row",
                req.key.as_str()
            ),
            retryable: true,
            source: None,
        })
    }

    /// The answer to `req` whose permit `kv` is there already (the key's record `rec`): granted
    /// when it is on `session` and the session vouches for it (adopted into [`super::held`]),
    /// else held.
    fn own_permit(
        &self,
        req: &AcquireRequest,
        n: &Names,
        kv: &Kv,
        rec: &LeaseRecord,
        session: &std::sync::Arc<session::Session>,
    ) -> AcquireOutcome {
        let alive = || {
            matches!(
                session.vouch(Instant::now() + req.ttl),
                session::Vouch::Alive
            )
        };
        if kv.lease() == session.id
            && alive()
            && self.inner.held.adopt(
                &n.slot(slot_of(n, kv)),
                &req.token,
                kv.value(),
                kv.create_revision(),
                session.clone(),
                Instant::now() + req.ttl,
            )
        {
            return AcquireOutcome::Granted(view(rec, &req.token));
        }
        AcquireOutcome::Held(held_view(rec))
    }

    /// The answer to `req` (`want`) on a key not grantable now (`st` as read, its record `rec`,
    /// its waiter `waiter`), after registering as its waiter when asked and nobody is, or keeping
    /// our registration.
    async fn wait_for_permit(
        &self,
        req: &AcquireRequest,
        want: PermitRequest,
        n: &Names,
        st: &State,
        mut rec: LeaseRecord,
        waiter: Option<Waiter>,
    ) -> Result<AcquireOutcome> {
        let Some(wttl) = req.waiter_ttl else {
            return Ok(AcquireOutcome::Held(held_view(&rec)));
        };
        match waiter {
            None => {
                let kind_mod = st.kind.as_ref().map_or(0, |k| k.mod_revision());
                let when = vec![
                    Compare::create_revision(n.lock.clone(), CompareOp::Equal, 0),
                    Compare::mod_revision(n.kind.clone(), CompareOp::Equal, kind_mod),
                ];
                let kind = Some(waiter_kind(want));
                if self.register(req, wttl, when, kind).await? {
                    let w = Waiter {
                        waiter: req.holder.clone(),
                        waiter_token: req.token.clone(),
                        waiter_ttl_ms: crate::record::ms(wttl),
                        write: 0,
                        permit: Some(waiter_kind(want)),
                    };
                    Self::with_waiter(&mut rec, Some(&w));
                    if let Some(t) = rec.permits.as_mut().filter(|_| want.write()) {
                        t.writers_waiting.push(req.token.clone());
                    }
                }
            }
            Some(w) if w.waiter_token == req.token => {
                self.inner
                    .held
                    .extend(&n.waiter, &req.token, Instant::now() + wttl, None);
            }
            Some(_) => {}
        }
        Ok(AcquireOutcome::Held(held_view(&rec)))
    }

    /// Deletes the permit keys of `key` that `who` holds (its holder id or owner token; every
    /// one when `None`); the record as it was when one was deleted.
    pub(super) async fn force_free_permits(
        &self,
        n: &Names,
        key: &Key,
        st: &State,
        who: Option<&str>,
    ) -> Result<Option<LeaseRecord>> {
        let mut freed = false;
        for kv in &st.slots {
            let matches = match (who, permit_of(kv)) {
                (None, _) => true,
                (Some(w), Some(p)) => p.holder == w || p.token == w,
                (Some(_), None) => false,
            };
            if matches {
                let name = n.slot(slot_of(n, kv));
                freed |= self
                    .inner
                    .held
                    .delete_if(&name, kv.create_revision())
                    .await?;
            }
        }
        Ok(freed.then(|| record_of(key.as_str(), st, None)))
    }

    /// The permit keys `token` holds on `key` per the read `st`: its name and create revision.
    pub(super) fn slot_of_token(n: &Names, st: &State, token: &str) -> Option<(String, i64)> {
        st.slots
            .iter()
            .find(|kv| permit_of(kv).is_some_and(|p| p.token == token))
            .map(|kv| (n.slot(slot_of(n, kv)), kv.create_revision()))
    }

    /// The permit record of `key` as `st` shows it, with the renewed permit of `token`.
    pub(super) fn renewed(key: &Key, st: &State, token: &str, ttl: Duration) -> LeaseRecord {
        let mut rec = record_of(key.as_str(), st, None);
        let now = now_ms();
        if let Some(p) = rec
            .permits
            .as_mut()
            .and_then(|t| t.holders.iter_mut().find(|p| p.token == token))
        {
            p.renewed_ms = now;
            p.ttl_ms = crate::record::ms(ttl);
            p.expires_ms = now + p.ttl_ms;
        }
        view(&rec, token)
    }

    /// The permit records under `prefix` (each key's holders, no waiter).
    pub(super) async fn list_permits(&self, prefix: &str) -> Result<Vec<LeaseRecord>> {
        let (p, k) = (
            format!("{}{prefix}", self.inner.permits),
            format!("{}{prefix}", self.inner.kinds),
        );
        let all = || Some(GetOptions::new().with_prefix());
        let r = self
            .txn(Txn::new().and_then([TxnOp::get(p, all()), TxnOp::get(k, all())]))
            .await?;
        let mut gets = gets(r).into_iter();
        let (slots, kinds) = (
            gets.next().unwrap_or_default(),
            gets.next().unwrap_or_default(),
        );
        let kinds: std::collections::HashMap<String, PermitKind> = kinds
            .iter()
            .filter_map(|kv| {
                let name = kv.key_str()?;
                let key = name.get(self.inner.kinds.len()..)?;
                Some((key.to_owned(), parse_kind(kv.value())?))
            })
            .collect();
        let mut by_key: std::collections::BTreeMap<String, State> = Default::default();
        for kv in slots {
            let Some(key) = kv
                .key_str()
                .and_then(|n| n.get(self.inner.permits.len()..))
                .and_then(|rest| rest.split('\0').next())
                .map(str::to_owned)
            else {
                continue;
            };
            by_key.entry(key).or_default().slots.push(kv);
        }
        Ok(by_key
            .into_iter()
            .map(|(key, st)| record_of(&key, &st, kinds.get(&key).copied()))
            .collect())
    }

    /// Deletes the kind keys with no permit left; (removed, kept).
    pub(super) async fn cleanup_kinds(&self) -> Result<(usize, usize)> {
        let from = self.inner.kinds.clone();
        let mut got = self
            .call(|mut c| {
                let from = from.clone();
                async move { c.get(from, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let (mut removed, mut kept) = (0, 0);
        for kv in got.take_kvs() {
            let Some(key) = kv
                .key_str()
                .ok()
                .and_then(|n| n.get(self.inner.kinds.len()..))
            else {
                continue;
            };
            let prefix = format!("{}{key}\0", self.inner.permits);
            let r = self
                .txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(prefix, CompareOp::Equal, 0).with_prefix(),
                            Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision()),
                        ])
                        .and_then([TxnOp::delete(kv.key(), None)]),
                )
                .await?;
            if r.succeeded() {
                removed += 1;
            } else {
                kept += 1;
            }
        }
        Ok((removed, kept))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            lock: "p/lock/k".into(),
            waiter: "p/waiter/k".into(),
            kind: "p/kind/k".into(),
            prefix: "p/permit/k\0".into(),
        }
    }

    fn req(holder: &str, want: PermitRequest) -> AcquireRequest {
        let key = Key::new("k").expect("a key");
        let mut r = AcquireRequest::new(key, holder, Duration::from_secs(10));
        r.token = format!("{holder}-token");
        r.permit = Some(want);
        r
    }

    /// The permit key of `holder` in `slot`, created at `rev`.
    fn slot(holder: &str, slot: &str, rev: i64, write: bool) -> Kv {
        let permit = Permit {
            holder: holder.into(),
            token: format!("{holder}-token"),
            fence: 0,
            write,
            acquired_ms: 1,
            renewed_ms: 1,
            expires_ms: 10_001,
            ttl_ms: 10_000,
            pid: None,
            host: None,
            labels: Default::default(),
        };
        let value = serde_json::to_vec(&Slot { permit, once: 1 }).expect("json");
        Kv::new(format!("p/permit/k\0{slot}"), value, rev, rev, 7)
    }

    fn kind(value: &str) -> Option<Kv> {
        Some(Kv::new("p/kind/k", value, 3, 5, 0))
    }

    fn waiter(holder: &str, permit: &str) -> Option<Kv> {
        let w = Waiter {
            waiter: holder.into(),
            waiter_token: format!("{holder}-token"),
            waiter_ttl_ms: 5_000,
            write: 1,
            permit: Some(permit.into()),
        };
        Some(Kv::new(
            "p/waiter/k",
            serde_json::to_vec(&w).expect("json"),
            11,
            11,
            8,
        ))
    }

    const TWO: PermitRequest = PermitRequest::Semaphore { permits: 2 };

    #[test]
    fn a_semaphore_grants_a_free_slot_and_compares_its_kind_as_read() {
        let st = State {
            kind: kind("semaphore:2"),
            slots: vec![slot("b", "0", 4, false)],
            ..State::default()
        };
        let Ok(Step::Try(p)) = plan(&req("a", TWO), TWO, &names(), &st) else {
            panic!("no grant");
        };
        assert_eq!(p.slot, "1");
        assert_eq!(p.also_free, None);
        assert!(!p.replace);
        assert_eq!(p.kind_mod, Some(5));
        assert_eq!((p.waiter_rev, p.waiter_mine), (0, false));
    }

    #[test]
    fn a_full_semaphore_waits_and_a_waiter_keeps_a_slot_free() {
        let full = State {
            kind: kind("semaphore:2"),
            slots: vec![slot("b", "0", 4, false), slot("c", "1", 5, false)],
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a", TWO), TWO, &names(), &full),
            Ok(Step::Wait(..))
        ));
        let waited = State {
            kind: kind("semaphore:2"),
            waiter: waiter("w", "semaphore:2"),
            ..State::default()
        };
        let Ok(Step::Try(p)) = plan(&req("a", TWO), TWO, &names(), &waited) else {
            panic!("no grant");
        };
        let also = p.also_free.expect("a slot left for the waiter");
        assert_ne!(also, p.slot);
        assert_eq!((p.waiter_rev, p.waiter_mine), (11, false));
        let one_left = State {
            kind: kind("semaphore:2"),
            waiter: waiter("w", "semaphore:2"),
            slots: vec![slot("b", "0", 4, false)],
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a", TWO), TWO, &names(), &one_left),
            Ok(Step::Wait(..))
        ));
    }

    #[test]
    fn readers_share_a_writer_is_alone_and_a_waiting_writer_stops_readers() {
        let (read, write) = (PermitRequest::Read, PermitRequest::Write);
        let reading = State {
            kind: kind("read-write"),
            slots: vec![slot("b", "3", 4, false)],
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a", read), read, &names(), &reading),
            Ok(Step::Try(_))
        ));
        assert!(matches!(
            plan(&req("a", write), write, &names(), &reading),
            Ok(Step::Wait(..))
        ));
        let writing = State {
            kind: kind("read-write"),
            slots: vec![slot("b", WRITER, 4, true)],
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a", read), read, &names(), &writing),
            Ok(Step::Wait(..))
        ));
        let writer_waits = State {
            kind: kind("read-write"),
            waiter: waiter("w", "write"),
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a", read), read, &names(), &writer_waits),
            Ok(Step::Wait(..))
        ));
        let Ok(Step::Try(p)) = plan(&req("w", write), write, &names(), &writer_waits) else {
            panic!("the registered writer is not granted");
        };
        assert_eq!(p.slot, WRITER);
        assert!(p.waiter_mine);
    }

    #[test]
    fn another_kind_is_refused_and_our_own_permit_is_found() {
        let rw = State {
            kind: kind("read-write"),
            slots: vec![slot("b", "3", 4, false)],
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a", TWO), TWO, &names(), &rw),
            Err(Error::InvalidOption { .. })
        ));
        let locked = State {
            lock: Some(Kv::new("p/lock/k", "{}", 2, 2, 7)),
            ..State::default()
        };
        assert!(matches!(
            plan(&req("a", TWO), TWO, &names(), &locked),
            Err(Error::InvalidOption { .. })
        ));
        let read = PermitRequest::Read;
        let Ok(Step::Ours { kv, .. }) = plan(&req("b", read), read, &names(), &rw) else {
            panic!("our permit not found");
        };
        assert_eq!(kv.create_revision(), 4);
        let fresh = State::default();
        let Ok(Step::Try(p)) = plan(&req("a", TWO), TWO, &names(), &fresh) else {
            panic!("no grant");
        };
        assert!(p.replace, "a key of no kind takes the kind asked");
    }

    #[test]
    fn the_first_guess_needs_no_read() {
        let p = guess(PermitRequest::Write, None);
        assert_eq!(
            (p.slot.as_str(), p.waiter_rev, p.waiter_mine),
            (WRITER, 0, false)
        );
        let p = guess(PermitRequest::Semaphore { permits: 3 }, Some(9));
        assert!(["0", "1", "2"].contains(&p.slot.as_str()));
        assert_eq!((p.waiter_rev, p.waiter_mine, p.kind_mod), (9, true, None));
    }
}
