//! The permit decisions, pure: semaphores and read-write locks over a record's permit table
//! ([`LeaseRecord::permits`]).
//!
//! * A key is a lock, a semaphore of `n` permits or a read-write lock, as its record says. A
//!   request of another kind (or count) is refused while the key has a holder or a waiter; a key
//!   with neither takes the kind it is asked as, keeping its fence.
//! * Each grant takes the key's next fence (`max(previous + 1, floor)`), so fences rise across
//!   permits, reads and writes alike.
//! * Waiters stand in the key's one line (`waiter`, then `queue`), as they do for a lock. A
//!   request is granted when the permits free now suffice for it and for every waiter ahead of
//!   it in line (arrival order): a semaphore grants while `holders + ahead + 1 ≤ n`; a writer
//!   only with no holder and nobody ahead; a reader with no writer holding or waiting ahead of
//!   it (a waiting writer blocks new readers, so writers are not starved), and at most
//!   [`PERMIT_LIMIT`] readers at once.
//! * Each permit expires on its own, judged by the store's [`Expiry`] rule per entry (observed
//!   per entry on the monotonic clock where the writer may be another machine).
//! * The record a holder is handed shows its own permit in the lock fields (holder, token,
//!   fence, times, labels), so the guard renews and releases a permit as it does a lock. The
//!   record a contender is handed shows the holders in words and the earliest expiry.

use super::{
    corrupt_placeholder, leave_line, passed_beyond_skew, tidy_line, Current, Expiry, Now,
    FENCE_EXHAUSTED,
};
use crate::error::{Error, Result};
use crate::holder::{host, pid};
use crate::record::{LeaseRecord, Permit, PermitKind, Permits, PERMIT_LIMIT};
use crate::store::{
    AcquireOutcome, AcquireRequest, LostReason, PermitRequest, ReleaseOutcome, RenewOutcome,
};

impl Expiry {
    /// Whether permit `p`, entry `i` of a permit table, is over at `now_ms`.
    pub(crate) fn permit_over(&self, i: usize, p: &Permit, now_ms: u64) -> bool {
        match self {
            Expiry::Clock => p.expires_ms <= now_ms,
            Expiry::Observed(o) => {
                (i < 64 && o.permits_lapsed & (1 << i) != 0)
                    || passed_beyond_skew(p.expires_ms, o.max_skew, now_ms)
            }
        }
    }
}

/// Drops the lapsed holders and waiters of a permit record (judged on `r` as read: call it
/// before anything else changes it), and the waiting writers no longer in line.
pub(crate) fn tidy(r: &mut LeaseRecord, expiry: Expiry, now_ms: u64) {
    tidy_line(r, expiry, now_ms);
    let in_line: Vec<bool> = r
        .permits
        .as_ref()
        .map(|t| {
            t.writers_waiting
                .iter()
                .map(|w| r.place_of(w).is_some())
                .collect()
        })
        .unwrap_or_default();
    if let Some(t) = r.permits.as_mut() {
        let holders = std::mem::take(&mut t.holders);
        t.holders = holders
            .into_iter()
            .enumerate()
            .filter(|(i, p)| !expiry.permit_over(*i, p, now_ms))
            .map(|(_, p)| p)
            .collect();
        let mut keep = in_line.into_iter();
        t.writers_waiting.retain(|_| keep.next().unwrap_or(false));
    }
}

/// The refusal of a request of `asked` on a key that is `is`.
pub(crate) fn mismatch(key: &str, is: &str, asked: &str) -> Error {
    Error::InvalidOption {
        name: "permits",
        reason: format!(
            "{key} is {is}, with holders or waiters now; it was asked for as {asked} (every \
             caller of a key must name the same kind and count)"
        ),
    }
}

/// What a request of a lock or a permit asks the key to be, in words.
pub(crate) fn asked(req: &AcquireRequest) -> String {
    match req.permit {
        Some(p) => p.kind().to_string(),
        None => "a lock".into(),
    }
}

/// Decides a permit acquisition (`req.permit` is set) on whatever the key holds.
pub(crate) fn acquire(
    current: Current<'_>,
    req: &AcquireRequest,
    want: PermitRequest,
    now: Now,
    expiry: Expiry,
    fence_floor: u64,
) -> Result<(AcquireOutcome, Option<LeaseRecord>)> {
    want.validate()?;
    let key = req.key.as_str();
    let kind = want.kind();
    let mut r = match current {
        Current::Missing => LeaseRecord::free(key, 0),
        Current::Corrupt {
            salvaged_fence,
            over: false,
        } => {
            let placeholder = corrupt_placeholder(key, salvaged_fence.unwrap_or(0), now.ms);
            return Ok((AcquireOutcome::Held(placeholder), None));
        }
        Current::Corrupt {
            salvaged_fence,
            over: true,
        } => LeaseRecord::free(key, salvaged_fence.unwrap_or(0)),
        Current::Record(r) => r.clone(),
    };
    // A lock holder (on a permit key only another client's, such as the GCS service's) keeps
    // the key a lock.
    let lock_held = expiry.held(&r, now.ms);
    tidy(&mut r, expiry, now.ms);
    let busy = lock_held
        || r.waiter_token.is_some()
        || r.permits.as_ref().is_some_and(|t| !t.holders.is_empty());
    match &r.permits {
        _ if lock_held => return Err(mismatch(key, "a lock", &asked(req))),
        Some(t) if t.kind == kind => {}
        Some(t) if busy => return Err(mismatch(key, &t.kind.to_string(), &asked(req))),
        None if busy => return Err(mismatch(key, "a lock", &asked(req))),
        _ => {
            // Nobody holds or waits: the key takes the kind asked, and keeps its fence.
            r.holder = None;
            r.token = None;
            r.expires_ms = 0;
            r.permits = Some(Permits::new(kind));
        }
    }
    let Some(table) = r.permits.as_ref() else {
        return Ok((AcquireOutcome::Held(held_view(&r)), None));
    };
    if table.holders.iter().any(|p| p.token == req.token) {
        // Ours already (an earlier attempt was granted and its answer lost): granted again as
        // a renewal, in the same write, so that the permit counts from now, as its holder's
        // `valid_until` counts from this attempt's send.
        let ttl_ms = crate::record::ms(req.ttl);
        if let Some(p) = r
            .permits
            .as_mut()
            .and_then(|t| t.holders.iter_mut().find(|p| p.token == req.token))
        {
            renew_permit(p, ttl_ms, now.ms);
        }
        return Ok((AcquireOutcome::Granted(view(&r, &req.token)), Some(r)));
    }
    let place = r.place_of(&req.token);
    let line = line_tokens(&r);
    let ahead = &line[..place.unwrap_or(line.len()).min(line.len())];
    let held = table.holders.len();
    let writer_holds = table.holders.iter().any(|p| p.write);
    let writer_ahead = ahead.iter().any(|t| table.writers_waiting.contains(t));
    let room = |limit: u32| held + ahead.len() < limit as usize;
    let grantable = match want {
        PermitRequest::Write => held == 0 && ahead.is_empty(),
        PermitRequest::Read => !writer_holds && !writer_ahead && room(PERMIT_LIMIT),
        PermitRequest::Semaphore { permits } => room(permits),
    };
    if !grantable {
        let (seen, mut write) = super::wait_in_line(r, req, now.ms);
        if want.write() {
            for w in write.iter_mut() {
                let token = req.token.clone();
                let queued = w.place_of(&token).is_some();
                if let Some(t) = w.permits.as_mut().filter(|_| queued) {
                    if !t.writers_waiting.contains(&token) {
                        t.writers_waiting.push(token);
                    }
                }
            }
        }
        return Ok((AcquireOutcome::Held(held_view(&seen)), write));
    }
    let Some(next) = r.fence.checked_add(1) else {
        let mut x = LeaseRecord::free(key, r.fence);
        x.holder = Some(FENCE_EXHAUSTED.to_owned());
        return Ok((AcquireOutcome::Held(x), None));
    };
    let fence = next.max(fence_floor);
    let ttl_ms = crate::record::ms(req.ttl);
    r.fence = fence;
    leave_line(&mut r, &req.token);
    if let Some(t) = r.permits.as_mut() {
        t.writers_waiting.retain(|w| *w != req.token);
        t.holders.push(Permit {
            holder: req.holder.clone(),
            token: req.token.clone(),
            fence,
            write: want.write(),
            acquired_ms: now.ms,
            renewed_ms: now.ms,
            expires_ms: now.ms.saturating_add(ttl_ms),
            ttl_ms,
            pid: Some(pid()),
            host: Some(host().to_owned()),
            labels: req.labels.clone(),
        });
    }
    Ok((AcquireOutcome::Granted(view(&r, &req.token)), Some(r)))
}

/// The permit record `r` as a lock record, for a lock request: refused while it has a holder or
/// a waiter; else without its table (its fence kept).
pub(crate) fn as_lock(
    r: &LeaseRecord,
    req: &AcquireRequest,
    expiry: Expiry,
    now_ms: u64,
) -> Result<LeaseRecord> {
    // Judged on a tidied copy; the record handed on is as read, since the lock decision judges
    // its line again (lapses are marked by position in the record as read).
    let mut tidied = r.clone();
    tidy(&mut tidied, expiry, now_ms);
    match tidied.permits {
        Some(t) if !t.holders.is_empty() || tidied.waiter_token.is_some() => {
            Err(mismatch(req.key.as_str(), &t.kind.to_string(), &asked(req)))
        }
        _ => {
            let mut n = r.clone();
            n.permits = None;
            Ok(n)
        }
    }
}

/// The tokens of `r`'s line in order: the registered waiter, then the queue.
fn line_tokens(r: &LeaseRecord) -> Vec<String> {
    r.waiter_token
        .iter()
        .cloned()
        .chain(r.queue.iter().map(|w| w.token.clone()))
        .collect()
}

/// Decides a renewal of the permit `token` holds on the permit record `r`.
pub(crate) fn renew(
    r: &LeaseRecord,
    token: &str,
    ttl_ms: u64,
    now_ms: u64,
    expiry: Expiry,
) -> (RenewOutcome, Option<LeaseRecord>) {
    let Some(mine) = holding(r, token) else {
        return (RenewOutcome::Lost(LostReason::Released), None);
    };
    if mine.expires_ms <= now_ms {
        return (RenewOutcome::Lost(LostReason::Expired), None);
    }
    let mut n = r.clone();
    tidy(&mut n, expiry, now_ms);
    let Some(p) = n
        .permits
        .as_mut()
        .and_then(|t| t.holders.iter_mut().find(|p| p.token == token))
    else {
        return (RenewOutcome::Lost(LostReason::Expired), None);
    };
    renew_permit(p, ttl_ms, now_ms);
    (RenewOutcome::Renewed(view(&n, token)), Some(n))
}

/// Writes a renewal of permit `p` for `ttl_ms` at `now_ms`.
fn renew_permit(p: &mut Permit, ttl_ms: u64, now_ms: u64) {
    p.renewed_ms = now_ms;
    p.ttl_ms = ttl_ms;
    p.expires_ms = now_ms.saturating_add(ttl_ms);
}

/// Decides a release of the permit `token` holds on the permit record `r`.
pub(crate) fn release(
    r: &LeaseRecord,
    token: &str,
    now_ms: u64,
    expiry: Expiry,
) -> (ReleaseOutcome, Option<LeaseRecord>) {
    let Some(mine) = holding(r, token) else {
        return (ReleaseOutcome::NotHeld, None);
    };
    let outcome = if mine.expires_ms > now_ms {
        ReleaseOutcome::Released
    } else {
        ReleaseOutcome::NotHeld
    };
    let mut n = r.clone();
    tidy(&mut n, expiry, now_ms);
    if let Some(t) = n.permits.as_mut() {
        t.holders.retain(|p| p.token != token);
    }
    n.renewed_ms = now_ms;
    (outcome, Some(n))
}

/// The permit `token` holds on `r`, if any.
fn holding<'a>(r: &'a LeaseRecord, token: &str) -> Option<&'a Permit> {
    r.permits
        .as_ref()?
        .holders
        .iter()
        .find(|p| p.token == token)
}

/// Whether a permit record has a live holder at `now_ms` (judged with `expiry`).
pub(crate) fn any_held(r: &LeaseRecord, expiry: Expiry, now_ms: u64) -> bool {
    r.permits.as_ref().is_some_and(|t| {
        t.holders
            .iter()
            .enumerate()
            .any(|(i, p)| !expiry.permit_over(i, p, now_ms))
    })
}

/// The record to write when an operator frees what `who` holds on `r` (every holder when
/// `None`; else the holders whose id or token is `who`), if anything; a lock's waiters are kept
/// while `expiry` judges them live.
pub(crate) fn force_freed(
    r: &LeaseRecord,
    who: Option<&str>,
    now_ms: u64,
    expiry: Expiry,
) -> Option<LeaseRecord> {
    let matches = |holder: &str, token: &str| who.is_none_or(|w| w == holder || w == token);
    if let Some(t) = &r.permits {
        if !t.holders.iter().any(|p| matches(&p.holder, &p.token)) {
            return None;
        }
        let mut n = r.clone();
        if let Some(t) = n.permits.as_mut() {
            t.holders.retain(|p| !matches(&p.holder, &p.token));
        }
        n.renewed_ms = now_ms;
        return Some(n);
    }
    let token = r.token.as_deref()?;
    matches(r.holder.as_deref().unwrap_or_default(), token).then(|| super::freed(r, now_ms, expiry))
}

/// The record the holder of `token` is handed: its permit in the lock fields.
pub(crate) fn view(r: &LeaseRecord, token: &str) -> LeaseRecord {
    let mut v = r.clone();
    if let Some(p) = holding(r, token) {
        v.holder = Some(p.holder.clone());
        v.token = Some(p.token.clone());
        v.fence = p.fence;
        v.acquired_ms = p.acquired_ms;
        v.renewed_ms = p.renewed_ms;
        v.expires_ms = p.expires_ms;
        v.ttl_ms = p.ttl_ms;
        v.pid = p.pid;
        v.host = p.host.clone();
        v.labels = p.labels.clone();
    }
    v
}

/// The record a contender is handed: the holders in words, the latest grant's token (it changes
/// with every grant) and the earliest expiry (when a lapsed permit could next come free).
pub(crate) fn held_view(r: &LeaseRecord) -> LeaseRecord {
    let mut v = r.clone();
    let Some(t) = &r.permits else {
        return v;
    };
    let (Some(last), Some(first_out)) = (
        t.holders.last(),
        t.holders.iter().min_by_key(|p| p.expires_ms),
    ) else {
        v.holder = None;
        v.token = None;
        v.expires_ms = 0;
        return v;
    };
    v.holder = Some(describe_holders(t));
    v.token = Some(last.token.clone());
    v.expires_ms = first_out.expires_ms;
    v.ttl_ms = first_out.ttl_ms;
    v.renewed_ms = first_out.renewed_ms;
    v.acquired_ms = last.acquired_ms;
    v.pid = None;
    v.host = None;
    v.labels.clear();
    v
}

/// Who holds a permit table, for messages: `"a, b (2 of 2 permits)"`, `"w (writing)"`,
/// `"a, b (reading)"`.
pub(crate) fn describe_holders(t: &Permits) -> String {
    const SHOWN: usize = 5;
    let mut names: Vec<&str> = t
        .holders
        .iter()
        .take(SHOWN)
        .map(|p| p.holder.as_str())
        .collect();
    names.dedup();
    let mut who = names.join(", ");
    if t.holders.len() > SHOWN {
        who.push_str(&format!(" and {} more", t.holders.len() - SHOWN));
    }
    match t.kind {
        PermitKind::Semaphore { permits } => {
            format!("{who} ({} of {permits} permits)", t.holders.len())
        }
        PermitKind::ReadWrite if t.holders.iter().any(|p| p.write) => format!("{who} (writing)"),
        PermitKind::ReadWrite => format!("{who} (reading)"),
    }
}

#[cfg(test)]
mod tests;
