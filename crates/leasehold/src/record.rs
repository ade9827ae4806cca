//! The lease record every store keeps, and time helpers.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch on this machine's wall clock (0 if the clock is set before
/// 1970). The `now_ms` the [`LeaseRecord`] helpers take.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use leasehold::now_ms;
/// use std::time::Duration;
/// let locks = leasehold::Locks::new(leasehold::stores::memory::MemoryStore::new());
/// let guard = locks.lock("k")?.ttl(Duration::from_secs(30)).acquire().await?;
/// assert!(guard.record().is_held(now_ms()));
/// assert!(guard.record().remaining(now_ms()) <= Duration::from_secs(30));
/// # guard.release().await?; Ok::<(), leasehold::Error>(()) }).unwrap();
/// ```
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(crate::record::ms)
        .unwrap_or(0)
}

/// `d` in whole milliseconds, `u64::MAX` for longer (a cast would keep only its low 64 bits: a
/// huge duration would read as a short one).
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Microseconds since the Unix epoch on this machine's wall clock.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// One key's state as a store keeps it. Free records (released or expired) keep their `fence` so the
/// next acquisition continues from it.
///
/// Times are Unix milliseconds of the clock that judges expiry (the store's own where it has one,
/// else the acquirer's wall clock); the serialised form also carries them as RFC 3339 strings for
/// people reading the record with `cat`, `redis-cli GET`, `kubectl describe` and the like.
///
/// ```
/// use leasehold::LeaseRecord;
/// use std::time::Duration;
/// let mut r = LeaseRecord::free("user:alice", 7);
/// r.holder = Some("web-1".into());
/// r.token = Some("t1".into());
/// r.expires_ms = 1_790_000_030_000;
/// assert!(r.is_held(1_790_000_000_000));
/// assert_eq!(r.remaining(1_790_000_000_000), Duration::from_secs(30));
/// assert!(!r.is_held(r.expires_ms), "expired at its expiry time");
/// let json = serde_json::to_string(&r).unwrap();
/// assert!(json.contains(r#""expires":"2026-09-21T"#), "{json}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseRecord {
    /// The key, as the user wrote it.
    pub key: String,
    /// The holder's identity, `None` when the lease is free.
    pub holder: Option<String>,
    /// The owner token of the current acquisition (unique per acquisition), `None` when free.
    pub token: Option<String>,
    /// The fence of the latest acquisition; strictly increasing per key.
    pub fence: u64,
    /// When the current holder acquired the lease.
    #[serde(rename = "acquired", alias = "acquired_ms", with = "ms_time")]
    pub acquired_ms: u64,
    /// When the current holder last renewed the lease.
    #[serde(rename = "renewed", alias = "renewed_ms", with = "ms_time")]
    pub renewed_ms: u64,
    /// When the lease expires unless renewed.
    #[serde(rename = "expires", alias = "expires_ms", with = "ms_time")]
    pub expires_ms: u64,
    /// The lease's time to live in milliseconds.
    pub ttl_ms: u64,
    /// The registered waiter's identity, if any.
    #[serde(default)]
    pub waiter: Option<String>,
    /// The registered waiter's token.
    #[serde(default)]
    pub waiter_token: Option<String>,
    /// When the waiter registration lapses unless renewed.
    #[serde(default, rename = "waiter_expires", with = "opt_ms_time")]
    pub waiter_expires_ms: Option<u64>,
    /// The waiter registration's lifetime in milliseconds, as the waiter asked for it: a
    /// contender on another machine judges the registration lapsed once it has seen it unchanged
    /// for this long, without trusting the waiter's wall clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiter_ttl_ms: Option<u64>,
    /// The waiters in line behind the registered one (`waiter`), in arrival order: when the
    /// lease is granted to the registered waiter, the first of these becomes the registered
    /// waiter. At most [`QUEUE_LIMIT`] entries; stores without a line
    /// ([`Capabilities::waiter_line`](crate::Capabilities::waiter_line): PostgreSQL, etcd,
    /// Redlock) leave it empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue: Vec<QueuedWaiter>,
    /// The holder's process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The holder's host.
    #[serde(default)]
    pub host: Option<String>,
    /// Free labels (task id, purpose …).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Store-specific detail (the file store records whether the holder owns the kernel lock).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub store: BTreeMap<String, String>,
    /// The permit table of a semaphore or read-write key (`None` for a lock). On such a key the
    /// fields above describe no holder in the stored record: `fence` is the last fence the key
    /// issued and the line of waiters (`waiter`, `queue`) waits for permits, while the holders
    /// are listed here. The record a permit holder is handed (granted, renewed) shows its own
    /// permit in the fields above, with this table beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<Permits>,
    /// The lease was handed to its holder by the previous holder's release, which granted it to
    /// the first in line in the same write ([`Capabilities::release_grants`]), and the holder
    /// has not claimed it yet. Until its next acquire attempt claims it (and renews it to its
    /// own TTL), it lasts only for what was left of its place in line: `expires_ms` and
    /// `ttl_ms` are the place's, and `pid`, `host` and `labels` are unknown.
    ///
    /// [`Capabilities::release_grants`]: crate::Capabilities::release_grants
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unclaimed: bool,
}

impl LeaseRecord {
    /// A free record that has issued no fence yet (or whose fence floor is `fence`).
    ///
    /// ```
    /// let r = leasehold::LeaseRecord::free("k", 41);
    /// assert!(!r.is_held(0) && r.holder.is_none());
    /// assert_eq!(r.fence, 41); // the next grant's fence is above it
    /// ```
    pub fn free(key: &str, fence: u64) -> Self {
        LeaseRecord {
            key: key.to_owned(),
            holder: None,
            token: None,
            fence,
            acquired_ms: 0,
            renewed_ms: 0,
            expires_ms: 0,
            ttl_ms: 0,
            waiter: None,
            waiter_token: None,
            waiter_expires_ms: None,
            waiter_ttl_ms: None,
            queue: Vec::new(),
            pid: None,
            host: None,
            labels: BTreeMap::new(),
            store: BTreeMap::new(),
            permits: None,
            unclaimed: false,
        }
    }

    /// Where the acquisition of `token` stands in this record's line of waiters: 0 for the
    /// registered waiter ([`waiter_token`](Self::waiter_token)), 1 for the first of the
    /// [`queue`](Self::queue), …; `None` when it is not in line. Whether the place has lapsed is
    /// not judged here.
    ///
    /// ```
    /// let mut r = leasehold::LeaseRecord::free("k", 0);
    /// r.waiter_token = Some("t0".into());
    /// assert_eq!((r.place_of("t0"), r.place_of("t1")), (Some(0), None));
    /// ```
    pub fn place_of(&self, token: &str) -> Option<usize> {
        if self.waiter_token.as_deref() == Some(token) {
            return Some(0);
        }
        self.queue
            .iter()
            .position(|w| w.token == token)
            .map(|i| i + 1)
    }

    /// Whether a live holder has the lease at `now_ms`: it has an owner token and `expires_ms`
    /// is after `now_ms`. It says nothing about whether the holder process is alive (the file
    /// store checks that separately). See the type's example.
    pub fn is_held(&self, now_ms: u64) -> bool {
        self.token.is_some() && self.expires_ms > now_ms
    }

    /// Whether a waiter registration is live at `now_ms`: it has a waiter token and
    /// `waiter_expires_ms` is after `now_ms`.
    ///
    /// ```
    /// let mut r = leasehold::LeaseRecord::free("k", 0);
    /// r.waiter = Some("b".into());
    /// r.waiter_token = Some("t2".into());
    /// r.waiter_expires_ms = Some(1_000);
    /// assert!(r.has_live_waiter(999));
    /// assert!(!r.has_live_waiter(1_000), "lapsed");
    /// ```
    pub fn has_live_waiter(&self, now_ms: u64) -> bool {
        self.waiter_token.is_some() && self.waiter_expires_ms.is_some_and(|t| t > now_ms)
    }

    /// Time left before expiry at `now_ms` (zero when free or expired). See the type's example.
    pub fn remaining(&self, now_ms: u64) -> Duration {
        if self.token.is_none() {
            return Duration::ZERO;
        }
        Duration::from_millis(self.expires_ms.saturating_sub(now_ms))
    }
}

/// The most waiters a record keeps in line behind its registered waiter ([`LeaseRecord::queue`]);
/// a contender that finds the line full waits without a place in it, polling.
pub const QUEUE_LIMIT: usize = 63;

/// The prefix of the token a store gives a waiter registration that another client wrote in its
/// own fields (the single-waiter GCS lock service's `waitingOwnerId`). Such a waiter knows
/// nothing of grants: a release only reserves the lease for it, as that client expects, and it
/// takes the lease itself.
pub(crate) const FOREIGN_WAITER: &str = "gcs-waiter:";

/// A waiter in line for a lease ([`LeaseRecord::queue`]): who, the token of its acquisition, and
/// when its place lapses unless the waiter renews it (on the waiter's clock, judged like the
/// registered waiter's `waiter_expires`).
///
/// ```
/// use leasehold::QueuedWaiter;
/// let w = QueuedWaiter::new("worker-2", "t2", 1_790_000_005_000, 5_000);
/// let json = serde_json::to_string(&w).unwrap();
/// assert!(json.contains(r#""expires":"2026-09-21T"#), "{json}");
/// assert_eq!(serde_json::from_str::<QueuedWaiter>(&json).unwrap(), w);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueuedWaiter {
    /// The waiter's identity.
    pub holder: String,
    /// The token of the waiting acquisition.
    pub token: String,
    /// When the place lapses unless renewed (the waiter's wall clock).
    #[serde(rename = "expires", alias = "expires_ms", with = "ms_time")]
    pub expires_ms: u64,
    /// The place's lifetime in milliseconds, as the waiter asked for it.
    pub ttl_ms: u64,
}

impl QueuedWaiter {
    /// A place in line for `holder`'s acquisition `token`, lapsing at `expires_ms` unless
    /// renewed, with a lifetime of `ttl_ms`.
    pub fn new(
        holder: impl Into<String>,
        token: impl Into<String>,
        expires_ms: u64,
        ttl_ms: u64,
    ) -> Self {
        QueuedWaiter {
            holder: holder.into(),
            token: token.into(),
            expires_ms,
            ttl_ms,
        }
    }
}

/// The most holders a semaphore or read-write key has at once: the largest permit count, and
/// the most readers holding together (a reader beyond them waits).
pub const PERMIT_LIMIT: u32 = 64;

/// What a semaphore or read-write key is: a semaphore of some permits, or a read-write lock.
///
/// ```
/// use leasehold::PermitKind;
/// assert_eq!(PermitKind::Semaphore { permits: 4 }.to_string(), "a semaphore of 4 permits");
/// assert_eq!(PermitKind::ReadWrite.to_string(), "a read-write lock");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PermitKind {
    /// At most `permits` holders at once (1 ..= [`PERMIT_LIMIT`]).
    Semaphore {
        /// The permit count.
        permits: u32,
    },
    /// Many readers (at most [`PERMIT_LIMIT`] at once) or one writer.
    ReadWrite,
}

impl std::fmt::Display for PermitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PermitKind::Semaphore { permits: 1 } => f.write_str("a semaphore of 1 permit"),
            PermitKind::Semaphore { permits } => write!(f, "a semaphore of {permits} permits"),
            PermitKind::ReadWrite => f.write_str("a read-write lock"),
        }
    }
}

/// The permit table of a semaphore or read-write key ([`LeaseRecord::permits`]).
///
/// ```
/// use leasehold::{LeaseRecord, PermitKind, Permits};
/// let mut r = LeaseRecord::free("render-slots", 0);
/// r.permits = Some(Permits::new(PermitKind::Semaphore { permits: 4 }));
/// let json = serde_json::to_string(&r).unwrap();
/// assert!(json.contains(r#""permits":{"kind":"semaphore","permits":4,"holders":[]}"#), "{json}");
/// assert_eq!(serde_json::from_str::<LeaseRecord>(&json).unwrap(), r);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Permits {
    /// What the key is.
    #[serde(flatten)]
    pub kind: PermitKind,
    /// The permits held, in the order they were granted.
    pub holders: Vec<Permit>,
    /// The tokens of the writers in the key's line of waiters (a read-write lock): a reader
    /// behind a waiting writer waits too, so that writers are not starved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writers_waiting: Vec<String>,
}

impl Permits {
    /// An empty table.
    pub fn new(kind: PermitKind) -> Self {
        Permits {
            kind,
            holders: Vec::new(),
            writers_waiting: Vec::new(),
        }
    }
}

/// One permit held on a semaphore or read-write key: the holder's part of a lock record, per
/// holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Permit {
    /// The holder's identity.
    pub holder: String,
    /// The owner token of this acquisition.
    pub token: String,
    /// This permit's fence: above every fence the key issued before it.
    pub fence: u64,
    /// Whether it is a read-write lock's write permit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write: bool,
    /// When it was granted.
    #[serde(rename = "acquired", with = "ms_time")]
    pub acquired_ms: u64,
    /// When it was last renewed.
    #[serde(rename = "renewed", with = "ms_time")]
    pub renewed_ms: u64,
    /// When it expires unless renewed (the holder's clock).
    #[serde(rename = "expires", with = "ms_time")]
    pub expires_ms: u64,
    /// Its time to live in milliseconds.
    pub ttl_ms: u64,
    /// The holder's process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The holder's host.
    #[serde(default)]
    pub host: Option<String>,
    /// Free labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// The last millisecond RFC 3339 can write: 9999-12-31T23:59:59.999Z.
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

/// Unix milliseconds as RFC 3339 (UTC, with milliseconds), as records keep their times. A time
/// past the year 9999 — which no lease of leasehold's reaches (TTLs are at most a year), but a
/// damaged record or another client's value can carry — is written as its millisecond count,
/// which [`LeaseRecord`]s read back.
///
/// ```
/// use leasehold::format_ms;
/// assert_eq!(format_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
/// assert_eq!(format_ms(u64::MAX), u64::MAX.to_string());
/// ```
pub fn format_ms(ms: u64) -> String {
    if ms > LAST_RFC3339_MS {
        return ms.to_string();
    }
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Reads a time written by [`format_ms`] (RFC 3339, or a millisecond count).
pub(crate) fn parse_ms(s: &str) -> Result<u64, String> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(s).map_err(|e| format!("bad time {s:?}: {e}"))?;
    t.duration_since(UNIX_EPOCH)
        .map(crate::record::ms)
        .map_err(|e| e.to_string())
}

/// Serialises Unix milliseconds as an RFC 3339 string (0 as `null`), reads both forms back.
mod ms_time {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Num(u64),
        Str(String),
        Null(()),
    }

    pub(super) fn serialize<S: Serializer>(ms: &u64, s: S) -> Result<S::Ok, S::Error> {
        if *ms == 0 {
            s.serialize_none()
        } else {
            s.serialize_str(&super::format_ms(*ms))
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Either::deserialize(d)? {
            Either::Num(n) => Ok(n),
            Either::Str(s) => super::parse_ms(&s).map_err(serde::de::Error::custom),
            Either::Null(()) => Ok(0),
        }
    }
}

mod opt_ms_time {
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(ms: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match ms {
            Some(ms) => s.serialize_str(&super::format_ms(*ms)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let v = super::ms_time::deserialize(d)?;
        Ok(if v == 0 { None } else { Some(v) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_readable_json() {
        let mut r = LeaseRecord::free("user:alice", 7);
        r.holder = Some("pod-1".into());
        r.token = Some("t".into());
        r.acquired_ms = 1_790_000_000_123;
        r.renewed_ms = r.acquired_ms;
        r.expires_ms = r.acquired_ms + 30_000;
        r.waiter_expires_ms = Some(r.acquired_ms + 1);
        let json = serde_json::to_string_pretty(&r).unwrap();
        assert!(json.contains("\"expires\": \"20"), "{json}");
        let back: LeaseRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }
}
