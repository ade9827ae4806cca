//! The waiters' line of a record: the registered waiter first, then the queue in arrival order;
//! joining it, keeping a place, leaving it, and dropping the places that lapsed.

use super::Expiry;
use crate::record::{LeaseRecord, QueuedWaiter, QUEUE_LIMIT};
use crate::store::AcquireRequest;

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
    match r.place_of(token) {
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

/// A contender that cannot be granted: with `req.waiter_ttl`, it joins `line` (the record with
/// its lapsed waiters dropped) or renews its place in it. Returns the record it is answered with
/// and the record to write, if anything changes.
pub(crate) fn wait_in_line(
    mut line: LeaseRecord,
    req: &AcquireRequest,
    now_ms: u64,
) -> (LeaseRecord, Option<LeaseRecord>) {
    let Some(wttl) = req.waiter_ttl else {
        return (line, None);
    };
    let wttl_ms = crate::record::ms(wttl);
    let renewed = now_ms + wttl_ms;
    match line.place_of(&req.token) {
        Some(p) => {
            let expires = match p {
                0 => line.waiter_expires_ms.unwrap_or(0),
                p => line.queue[p - 1].expires_ms,
            };
            // A fresh place of ours is left alone: rewriting it on every attempt would wake
            // every watcher (ourselves included) for nothing. Ours was written on this clock, so
            // its written expiry is judged directly.
            if expires >= now_ms + wttl_ms * 2 / 3 && expires > now_ms {
                return (line, None);
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
            (line.clone(), Some(line))
        }
        None if line.queue.len() < QUEUE_LIMIT => {
            line.queue.push(QueuedWaiter::new(
                req.holder.clone(),
                req.token.clone(),
                renewed,
                wttl_ms,
            ));
            promote(&mut line);
            (line.clone(), Some(line))
        }
        // The line is full: wait without a place.
        None => (line, None),
    }
}

/// Removes the waiter registration from `r`.
fn clear_waiter(r: &mut LeaseRecord) {
    r.waiter = None;
    r.waiter_token = None;
    r.waiter_expires_ms = None;
    r.waiter_ttl_ms = None;
}
