//! How lease records are shown beside the tables of `ls` and `inspect`: their state, their
//! waiter, their JSON (`ls --json`, `inspect --json`, `serve`'s `/api/leases`) and the line
//! `watch` prints (which leaves out what renewals change, so that it tells when a key changed).

use crate::output::{self, clean};
use leasehold::{Inspection, LeaseRecord};
use serde_json::{json, Value};
use std::time::Duration;

/// What `watch` tells of a key: its line, and its JSON (the record as `inspect --json` shows it,
/// or `{"key": …, "state": "none"}`). The line leaves out what renewals change.
pub(crate) fn watched(key: &str, seen: Option<&Inspection>, now: u64) -> (String, Value) {
    let k = clean(key);
    match seen {
        None => (format!("{k} none"), json!({"key": key, "state": "none"})),
        Some(Inspection::Corrupt { name, detail }) => (
            format!("{k} corrupt {}", clean(detail)),
            corrupt_json(name, detail),
        ),
        Some(Inspection::Record(r)) => {
            let mut line = format!("{k} {} fence {}", state(r, now), r.fence);
            if let Some(t) = &r.permits {
                // What it is and who holds it, without what renewals change (the expiries).
                line.push_str(&format!(" ({})", output::permits_summary(t, now)));
                for p in &t.holders {
                    line.push_str(&format!(
                        " holder {} fence {}",
                        output::permit_holder(t, p),
                        p.fence
                    ));
                    if p.expires_ms <= now {
                        line.push_str(" expired");
                    }
                }
            } else if let (Some(h), "held" | "expired") = (&r.holder, state(r, now)) {
                line.push_str(&format!(" holder {}", clean(h)));
            }
            if let Some(w) = waiter(r, now) {
                line.push_str(&format!(" waiter {}", clean(&w)));
            }
            let mut object = record_json(r, now);
            if let Some(o) = object.as_object_mut() {
                // Renewals change these; the line above does not show them either.
                o.remove("remaining_ms");
                for p in permit_objects(o) {
                    p.remove("remaining_ms");
                }
            }
            (line, object)
        }
    }
}

/// How long until the lease on `r`, or its first permit still held, expires (`None`: nothing
/// held at `now`).
pub(crate) fn next_expiry(r: &LeaseRecord, now: u64) -> Option<Duration> {
    match &r.permits {
        Some(t) => t
            .holders
            .iter()
            .filter(|p| p.expires_ms > now)
            .map(|p| Duration::from_millis(p.expires_ms - now))
            .min(),
        None => r.is_held(now).then(|| r.remaining(now)),
    }
}

/// What listings sort by: the key, or a corrupt record's name.
pub(crate) fn sort_key(i: &Inspection) -> &str {
    match i {
        Inspection::Record(r) => &r.key,
        Inspection::Corrupt { name, .. } => name,
    }
}

/// A record's state at `now`: `held`, `expired` or `free` ([`output::state`]).
pub(crate) fn state(r: &LeaseRecord, now: u64) -> &'static str {
    output::state(r, now)
}

/// The live waiter's identity, if any; `(write)` after it for a writer waiting on a read-write
/// key.
pub(crate) fn waiter(r: &LeaseRecord, now: u64) -> Option<String> {
    let who = r
        .has_live_waiter(now)
        .then(|| r.waiter.clone().unwrap_or_else(|| "unknown".into()))?;
    Some(match &r.waiter_token {
        Some(t) if writes(r, t) => format!("{who} (write)"),
        _ => who,
    })
}

/// Whether the waiter whose token is `token` waits for the write permit of a read-write key.
pub(crate) fn writes(r: &LeaseRecord, token: &str) -> bool {
    r.permits
        .as_ref()
        .is_some_and(|t| t.writers_waiting.iter().any(|w| w == token))
}

/// A record as JSON: the stored record plus `state` (`held`, `expired`, `free`) and
/// `remaining_ms`, without the owner tokens (they let whoever knows them renew or release the
/// lease as its holder). On a semaphore or read-write key, each permit of `permits.holders` has
/// its `state` and `remaining_ms` too, the key's `remaining_ms` is the longest of them (when the
/// key is free unless renewed), and `permits.writers_waiting` names the writers in line by
/// their ids.
pub(crate) fn record_json(r: &LeaseRecord, now: u64) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or_else(|_| json!({ "key": r.key }));
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let remaining = match &r.permits {
        Some(t) => t
            .holders
            .iter()
            .map(|p| p.expires_ms.saturating_sub(now))
            .max()
            .unwrap_or(0),
        None => ms(r.remaining(now)),
    };
    if let Some(o) = v.as_object_mut() {
        o.remove("token");
        o.remove("waiter_token");
        if let Some(Value::Array(queue)) = o.get_mut("queue") {
            for w in queue.iter_mut().filter_map(Value::as_object_mut) {
                w.remove("token");
            }
        }
        if let (Some(t), Some(Value::Object(table))) = (&r.permits, o.get_mut("permits")) {
            // The waiting writers' tokens, as the ids of those waiters.
            let writers: Vec<Value> = t
                .writers_waiting
                .iter()
                .filter_map(|token| waiter_id(r, token))
                .map(Value::from)
                .collect();
            if !writers.is_empty() {
                table.insert("writers_waiting".into(), writers.into());
            } else {
                table.remove("writers_waiting");
            }
        }
        for (p, stored) in permit_objects(o).zip(r.permits.iter().flat_map(|t| &t.holders)) {
            p.remove("token");
            let live = stored.expires_ms > now;
            p.insert("state".into(), if live { "held" } else { "expired" }.into());
            p.insert(
                "remaining_ms".into(),
                stored.expires_ms.saturating_sub(now).into(),
            );
        }
        o.insert("state".into(), state(r, now).into());
        o.insert("remaining_ms".into(), remaining.into());
    }
    v
}

/// The permits of a record's JSON object (`permits.holders`), as objects.
fn permit_objects(
    o: &mut serde_json::Map<String, Value>,
) -> impl Iterator<Item = &mut serde_json::Map<String, Value>> {
    o.get_mut("permits")
        .and_then(|t| t.get_mut("holders"))
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// The id of the waiter in `r`'s line whose token is `token`.
fn waiter_id(r: &LeaseRecord, token: &str) -> Option<String> {
    if r.waiter_token.as_deref() == Some(token) {
        return r.waiter.clone();
    }
    r.queue
        .iter()
        .find(|w| w.token == token)
        .map(|w| w.holder.clone())
}

/// An inspection as JSON; a corrupt record is `{"state": "corrupt", "name": …, "detail": …}`.
pub(crate) fn inspection_json(i: &Inspection, now: u64) -> Value {
    match i {
        Inspection::Record(r) => record_json(r, now),
        Inspection::Corrupt { name, detail } => corrupt_json(name, detail),
    }
}

/// A corrupt record as JSON: `{"key": null, "state": "corrupt", "name": …, "detail": …}`.
pub(crate) fn corrupt_json(name: &str, detail: &str) -> Value {
    json!({
        "key": Value::Null,
        "state": "corrupt",
        "name": name,
        "detail": detail,
    })
}
