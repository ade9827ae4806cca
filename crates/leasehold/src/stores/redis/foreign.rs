//! Other clients' locks under our record keys: a value that is not a record of ours (the random
//! token redis-py's `Lock`, redsync or redlock-go set with `SET NX PX`, JSON without our `key` and
//! `fence`, a value of another type) is held by an unknown holder until the server expires it, and
//! never replaced (the acquire script answers it with `foreign` in the prelude).

use crate::record::LeaseRecord;
use crate::store::Inspection;

/// The holder's token in a [`record`] (never a token of ours, which are hex).
pub(crate) const FOREIGN_TOKEN: &str = "foreign-value";

/// The expiry shown for a value without a TTL, held until deleted: the last millisecond RFC 3339
/// can write (9999-12-31T23:59:59.999Z).
pub(crate) const NEVER_MS: u64 = 253_402_300_799_999;

/// The lease another client holds on `key` with a value that is not a record of ours: of Redis
/// type `kind`, `len` bytes long (-1: not a string), expiring in `pttl` ms by the server's clock
/// (-1: never, until it is deleted), read at `now_ms` on the server's clock. Its holder is
/// unknown; leasehold never replaces it.
pub(crate) fn record(key: &str, kind: &str, len: i64, pttl: i64, now_ms: u64) -> LeaseRecord {
    let what = if len >= 0 {
        format!("a {kind} of {len} bytes")
    } else {
        format!("a Redis {kind}")
    };
    let until = if pttl >= 0 {
        "held until the server expires it"
    } else {
        "no TTL: held until deleted"
    };
    let mut r = LeaseRecord::free(key, 0);
    r.holder = Some(format!("unknown (foreign value: {what}; {until})"));
    r.token = Some(FOREIGN_TOKEN.to_owned());
    r.ttl_ms = u64::try_from(pttl).unwrap_or(0);
    r.expires_ms = match u64::try_from(pttl) {
        Ok(p) => now_ms.saturating_add(p).min(NEVER_MS),
        Err(_) => NEVER_MS,
    };
    r.store.insert("foreign".into(), kind.to_owned());
    r.store.insert("pttl_ms".into(), pttl.to_string());
    r
}

/// A stored value as an inspection: the record, or `None` when it is not a record of ours (the
/// store then inspects it as another client's value).
pub(crate) fn inspection(raw: &[u8]) -> Option<Inspection> {
    let r = serde_json::from_slice::<LeaseRecord>(raw).ok()?;
    Some(Inspection::Record(r))
}
