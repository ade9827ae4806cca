//! The lease object's JSON: the single-waiter GCS lock service's fields, which every client of the lock reads
//! and writes, and leasehold's record beside them.
//!
//! ```json
//! {
//!   "ownerId": "web-1",            // the holder; null when free
//!   "expiresAt": 1790000330.5,      // Unix seconds (float); 0 when free
//!   "waitingOwnerId": "web-2",      // the one waiter; null when none
//!   "waiterExpiresAt": 1790000035.0,// Unix seconds (float); 0 when none
//!   "leasehold": { "key": "job", "fence": 42, "token": "…", "expires_at_margin_ms": 300000, … }
//! }
//! ```
//!
//! That service's four fields are the truth. `leasehold` adds the owner token, fence, times and
//! labels of the lease **only when it describes that very lease** (same holder, and an
//! `expiresAt` equal, to the millisecond, to its `expires` plus the margin it was written with,
//! `expires_at_margin_ms`): an object another client wrote, or rewrote keeping our field, reads as
//! held by its `ownerId` ([`FOREIGN_TOKEN`]) for the foreign TTL, never as corrupt and never as
//! free. Fields leasehold does not know are kept as read when it replaces the object.
//!
//! `expiresAt` is written later than leasehold's own expiry by the margin (the assumed clock
//! skew): that service judges it by its own wall clock, with no margin of its own.

use crate::record::LeaseRecord;
use serde_json::{Map, Value};

/// The owner token leasehold reads for a lease another client holds: this prefix and its
/// `ownerId`. Never written.
pub(super) const FOREIGN_TOKEN: &str = "gcs-owner:";

/// The waiter token leasehold reads for a waiter another client registered: this prefix and its
/// `waitingOwnerId`. Never written.
pub(super) use crate::record::FOREIGN_WAITER;

const OWNER: &str = "ownerId";
const EXPIRES: &str = "expiresAt";
const WAITER: &str = "waitingOwnerId";
const WAITER_EXPIRES: &str = "waiterExpiresAt";
const OURS: &str = "leasehold";
/// In our field: how much later than the lease's `expires` the `expiresAt` beside it was written.
const MARGIN: &str = "expires_at_margin_ms";

/// Unix seconds (float) as milliseconds.
fn secs_to_ms(v: &Value) -> Option<u64> {
    let s = v.as_f64()?;
    (s.is_finite() && s >= 0.0).then(|| (s * 1000.0).round() as u64)
}

fn ms_to_secs(ms: u64) -> Value {
    serde_json::Number::from_f64(ms as f64 / 1000.0).map_or(Value::Null, Value::Number)
}

/// A non-empty string field.
fn text(map: &Map<String, Value>, k: &str) -> Result<Option<String>, String> {
    match map.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!("{k} is {v}, not a string")),
    }
}

/// A time field (Unix seconds); 0 reads as none.
fn time(map: &Map<String, Value>, k: &str) -> Result<Option<u64>, String> {
    match map.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match secs_to_ms(v) {
            Some(0) => Ok(None),
            Some(ms) => Ok(Some(ms)),
            None => Err(format!("{k} is {v}, not Unix seconds")),
        },
    }
}

/// Why an object is not a lease, and the fence found in it, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damaged {
    pub(crate) detail: String,
    pub(crate) fence: Option<u64>,
}

/// Parses an object's bytes into a JSON object.
pub(crate) fn parse(bytes: &[u8]) -> Result<Map<String, Value>, Damaged> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(Damaged {
            detail: format!("not a JSON object: {}", truncate(&other.to_string())),
            fence: None,
        }),
        Err(e) => Err(Damaged {
            detail: format!("not JSON: {e}"),
            fence: None,
        }),
    }
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s.to_owned()
    }
}

/// Gives `map`, an object without leasehold's field (the other service rewrote it with its four
/// fields only), the field of `previous`, the same object as this process last read or wrote it.
/// [`decode`] then takes from it only what still describes the service's fields (the same holder and
/// expiry, the same waiter and waiter expiry): a lease or waiter registration of ours that the
/// other service copied as it was stays ours; anything else it wrote reads as its own.
pub(crate) fn adopt(map: &mut Map<String, Value>, previous: &Map<String, Value>) {
    if map.contains_key(OURS) {
        return;
    }
    if let Some(ours) = previous.get(OURS) {
        map.insert(OURS.into(), ours.clone());
    }
}

/// The record an object holds; `key` names it when the object does not (another client wrote it).
/// A lease or a waiter registration of another client (which carries no TTL) is given
/// `foreign_ttl_ms`: it is over once seen unchanged for that long.
pub(crate) fn decode(
    map: &Map<String, Value>,
    key: &str,
    foreign_ttl_ms: u64,
) -> Result<LeaseRecord, Damaged> {
    let ours = map
        .get(OURS)
        .map(|v| serde_json::from_value::<LeaseRecord>(v.clone()));
    let salvaged = map
        .get(OURS)
        .and_then(|v| v.get("fence"))
        .and_then(Value::as_u64);
    let margin = map
        .get(OURS)
        .and_then(|v| v.get(MARGIN))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let damaged = |detail: String| Damaged {
        detail,
        fence: salvaged,
    };
    let owner = text(map, OWNER).map_err(damaged)?;
    let expires = time(map, EXPIRES);
    let mut r = match (&ours, &owner) {
        (Some(Ok(lh)), _) => lh.clone(),
        (Some(Err(e)), None) => return Err(damaged(format!("field {OURS}: {e}"))),
        // Damaged fields of ours cannot free a lease the service's fields say is held.
        (Some(Err(_)), Some(_)) | (None, _) => LeaseRecord::free(key, salvaged.unwrap_or(0)),
    };
    match owner {
        Some(h) => {
            // A holder without a readable expiry is held until an operator frees it.
            let expires_ms = expires.ok().flatten().unwrap_or(u64::MAX);
            let describes = r.token.is_some()
                && r.holder.as_deref() == Some(h.as_str())
                && r.expires_ms.saturating_add(margin).abs_diff(expires_ms) <= 1;
            if !describes {
                r.token = Some(format!("{FOREIGN_TOKEN}{h}"));
                r.holder = Some(h);
                r.expires_ms = expires_ms;
                r.acquired_ms = 0;
                r.renewed_ms = 0;
                r.ttl_ms = foreign_ttl_ms;
                r.pid = None;
                r.host = None;
                r.labels.clear();
            }
        }
        None => {
            // Free (released by another client, or never held): what ours said of a holder goes.
            r.token = None;
            r.holder = None;
            r.expires_ms = 0;
        }
    }
    let waiter = text(map, WAITER).map_err(damaged)?;
    let waiter_expires = time(map, WAITER_EXPIRES).map_err(damaged)?;
    match (waiter, waiter_expires) {
        (Some(w), Some(we)) => {
            let describes = r.waiter_token.is_some()
                && r.waiter.as_deref() == Some(w.as_str())
                && r.waiter_expires_ms.is_some_and(|x| x.abs_diff(we) <= 1);
            if !describes {
                r.waiter_token = Some(format!("{FOREIGN_WAITER}{w}"));
                r.waiter = Some(w);
                r.waiter_expires_ms = Some(we);
                r.waiter_ttl_ms = Some(foreign_ttl_ms);
            }
        }
        _ => {
            r.waiter = None;
            r.waiter_token = None;
            r.waiter_expires_ms = None;
            r.waiter_ttl_ms = None;
        }
    }
    Ok(r)
}

/// The object that stores `r`, built on `base` (the object as read at the version replaced, if
/// known): fields leasehold does not own stay as read, and a lease or waiter registration of
/// another client ([`FOREIGN_TOKEN`], [`FOREIGN_WAITER`]) keeps the service's fields exactly as read.
/// A lease of ours gets `expiresAt` = its `expires` + `margin_ms`, and our field says so.
pub(crate) fn encode(
    r: &LeaseRecord,
    base: Option<Map<String, Value>>,
    margin_ms: u64,
) -> Map<String, Value> {
    let mut map = base.unwrap_or_default();
    let foreign_owner = r
        .token
        .as_deref()
        .is_some_and(|t| t.starts_with(FOREIGN_TOKEN));
    let foreign_waiter = r
        .waiter_token
        .as_deref()
        .is_some_and(|t| t.starts_with(FOREIGN_WAITER));
    let mut ours = r.clone();
    let mut margin = None;
    if !(foreign_owner && map.contains_key(OWNER)) {
        let held = r.token.is_some();
        let owner = r.holder.clone().filter(|_| held);
        map.insert(OWNER.into(), owner.map_or(Value::Null, Value::String));
        let expires = if !held {
            0
        } else if foreign_owner || r.expires_ms == u64::MAX {
            r.expires_ms
        } else {
            margin = Some(margin_ms);
            r.expires_ms.saturating_add(margin_ms)
        };
        map.insert(
            EXPIRES.into(),
            if expires == u64::MAX {
                Value::Null
            } else {
                ms_to_secs(expires)
            },
        );
    }
    if foreign_owner {
        ours.token = None;
        ours.holder = None;
        ours.expires_ms = 0;
        ours.ttl_ms = 0;
    }
    if !(foreign_waiter && map.contains_key(WAITER)) {
        let live = r.waiter_token.is_some();
        let waiter = r.waiter.clone().filter(|_| live);
        map.insert(WAITER.into(), waiter.map_or(Value::Null, Value::String));
        let expires = r.waiter_expires_ms.filter(|_| live).unwrap_or(0);
        map.insert(WAITER_EXPIRES.into(), ms_to_secs(expires));
    }
    if foreign_waiter {
        ours.waiter = None;
        ours.waiter_token = None;
        ours.waiter_expires_ms = None;
        ours.waiter_ttl_ms = None;
    }
    let mut ours = serde_json::to_value(&ours).unwrap_or(Value::Null);
    if let (Some(m), Value::Object(o)) = (margin, &mut ours) {
        o.insert(MARGIN.into(), m.into());
    }
    map.insert(OURS.into(), ours);
    map
}
