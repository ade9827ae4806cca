//! Semaphores and read-write locks on PostgreSQL: a permit key's row in the lease table keeps
//! what the key is (`permit_kind`, `permit_count`), its fence, its registered waiter (with
//! `waiter_write`) and its `watched` mark; each permit held is a row of the permit table (see
//! [`super::sql`]). A permit acquisition is one statement, run again when the key changed
//! between its snapshot and its write ([`Sql::permit_acquire`](super::sql::Sql)); renewals,
//! releases and waiter withdrawals of permit tokens share the lock statements (each dispatches
//! on the key's row), so the guard renews and releases a permit as it does a lock.

use super::{millis, unsigned, Inner};
use crate::decide::permits::{asked, held_view, mismatch, view};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::{LeaseRecord, Permit, PermitKind, Permits};
use crate::store::{AcquireOutcome, AcquireRequest, PermitRequest};
use serde::Deserialize;
use tokio_postgres::Row;

/// How many times a step judged on a snapshot the key's row outdated is run again before the
/// caller is answered with a retryable error: each lost race means another step on the key
/// was written meanwhile.
const RACES: usize = 64;

/// The kind column's value for `kind`.
fn kind_name(kind: PermitKind) -> &'static str {
    match kind {
        PermitKind::Semaphore { .. } => "semaphore",
        PermitKind::ReadWrite => "read-write",
    }
}

/// The kind a row's `permit_kind` and `permit_count` say, `None` for a lock key.
fn kind_of(
    name: Option<&str>,
    count: Option<i32>,
) -> std::result::Result<Option<PermitKind>, String> {
    match (name, count) {
        (None, _) => Ok(None),
        (Some("read-write"), _) => Ok(Some(PermitKind::ReadWrite)),
        (Some("semaphore"), Some(n)) if n >= 1 => Ok(Some(PermitKind::Semaphore {
            permits: n.unsigned_abs(),
        })),
        (Some(other), n) => Err(format!("unknown permit kind {other:?} (count {n:?})")),
    }
}

/// One permit as [`super::sql`]'s holder array writes it.
#[derive(Deserialize)]
struct HolderRow {
    holder: String,
    token: String,
    fence: i64,
    write: bool,
    acquired: i64,
    renewed: i64,
    expires: i64,
    ttl_ms: i64,
    pid: Option<i32>,
    host: Option<String>,
    labels: String,
}

impl From<HolderRow> for Permit {
    fn from(h: HolderRow) -> Self {
        Permit {
            holder: h.holder,
            token: h.token,
            fence: unsigned(h.fence),
            write: h.write,
            acquired_ms: unsigned(h.acquired),
            renewed_ms: unsigned(h.renewed),
            expires_ms: unsigned(h.expires),
            ttl_ms: unsigned(h.ttl_ms),
            pid: h.pid.and_then(|p| u32::try_from(p).ok()),
            host: h.host,
            // Labels someone else wrote that are not a JSON object of strings read as none.
            labels: serde_json::from_str(&h.labels).unwrap_or_default(),
        }
    }
}

impl Inner {
    /// A store error for a row this store cannot read.
    fn unreadable(&self, detail: String) -> Error {
        Error::Store {
            source: None,
            store: self.link.shown().to_owned(),
            detail,
            retryable: false,
        }
    }

    /// The whole record in `r` from column `at` on ([`super::sql::full`]): the lock columns,
    /// then the permit kind, count, the waiter's write flag and the holders. A row without a key
    /// (nothing there) is `key`'s free record.
    pub(super) fn full_record(&self, r: &Row, at: usize, key: &str) -> Result<LeaseRecord> {
        let got = (|| {
            let name: Option<String> = r.try_get(at + 15)?;
            let count: Option<i32> = r.try_get(at + 16)?;
            let writer: bool = r.try_get::<_, Option<bool>>(at + 17)?.unwrap_or(false);
            let holders: Option<String> = r.try_get(at + 18)?;
            let there = r.try_get::<_, Option<String>>(at)?.is_some();
            let rec = match there {
                true => Some(super::record_at(r, at)?),
                false => None,
            };
            Ok::<_, tokio_postgres::Error>((rec, name, count, writer, holders))
        })();
        let (rec, name, count, writer, holders) = got.map_err(|e| self.err(e))?;
        let mut rec = rec.unwrap_or_else(|| LeaseRecord::free(key, 0));
        let kind = kind_of(name.as_deref(), count)
            .map_err(|e| self.unreadable(format!("the row of {key}: {e}")))?;
        let Some(kind) = kind else {
            return Ok(rec);
        };
        let rows: Vec<HolderRow> = match holders {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| self.unreadable(format!("the permits of {key}: {e}")))?,
            None => Vec::new(),
        };
        let mut table = Permits::new(kind);
        table.holders = rows.into_iter().map(Permit::from).collect();
        if writer {
            table.writers_waiting.extend(rec.waiter_token.clone());
        }
        rec.permits = Some(table);
        Ok(rec)
    }

    /// Takes a permit of `want` for `req` (see [`super::sql`]'s `permit_acquire`).
    pub(super) async fn acquire_permit(
        &self,
        req: &AcquireRequest,
        want: PermitRequest,
        labels: &str,
    ) -> Result<AcquireOutcome> {
        want.validate()?;
        let (ttl, wttl) = (millis(req.ttl), req.waiter_ttl.map_or(0, millis));
        let pid = i32::try_from(crate::holder::pid()).unwrap_or(0);
        let host = crate::holder::host();
        let key = req.key.as_str();
        let kind = kind_name(want.kind());
        let count: Option<i32> = match want {
            PermitRequest::Semaphore { permits } => i32::try_from(permits).ok(),
            PermitRequest::Read | PermitRequest::Write => None,
        };
        let write = want.write();
        for attempt in 0..RACES {
            if attempt > 0 && req.given_up.is_given_up() {
                return Err(Error::GivenUp { key: key.into() });
            }
            let rows = self
                .query(
                    &self.sql.permit_acquire,
                    &[
                        &key,
                        &req.holder,
                        &req.token,
                        &ttl,
                        &wttl,
                        &labels,
                        &pid,
                        &host,
                        &req.watching,
                        &kind,
                        &count,
                        &write,
                    ],
                )
                .await?;
            let Some(r) = rows.first() else {
                return Err(
                    self.unreadable(format!("acquiring a permit of {key} answered nothing"))
                );
            };
            let outcome: String = r.try_get(0).map_err(|e| self.err(e))?;
            let lock_held: bool = r.try_get(1).map_err(|e| self.err(e))?;
            let rec = self.full_record(r, 2, key)?;
            return match outcome.as_str() {
                "raced" => continue,
                "refused" => {
                    let is = match &rec.permits {
                        Some(t) if !lock_held => t.kind.to_string(),
                        _ => "a lock".to_owned(),
                    };
                    Err(mismatch(key, &is, &asked(req)))
                }
                "granted" => Ok(AcquireOutcome::Granted(view(&rec, &req.token))),
                _ => Ok(AcquireOutcome::Held(held_view(&rec))),
            };
        }
        Err(self.kept_changing(key))
    }

    /// A lock request found `key` a permit key: makes it a lock key again if it has no live
    /// holder and no live waiter (`Ok(None)`: acquire again), else answers what it is (the
    /// request is refused).
    pub(super) async fn to_lock(&self, key: &Key) -> Result<Option<String>> {
        let k = key.as_str();
        let rows = self.query(&self.sql.to_lock, &[&k]).await?;
        let Some(r) = rows.first() else {
            // Not a permit key any more.
            return Ok(None);
        };
        let got = (|| {
            Ok::<_, tokio_postgres::Error>((
                r.try_get::<_, bool>(0)?,
                r.try_get::<_, Option<String>>(1)?,
                r.try_get::<_, Option<i32>>(2)?,
            ))
        })();
        let (busy, name, count) = got.map_err(|e| self.err(e))?;
        if !busy {
            // Made a lock key, or changed meanwhile: either way, acquire again.
            return Ok(None);
        }
        let kind = kind_of(name.as_deref(), count)
            .map_err(|e| self.unreadable(format!("the row of {k}: {e}")))?;
        Ok(Some(
            kind.map_or_else(|| "a lock".to_owned(), |k| k.to_string()),
        ))
    }

    /// Frees what `who` holds on `key` (everybody's when `None`): the record as it was, when
    /// something was freed.
    pub(super) async fn force(&self, key: &Key, who: Option<&str>) -> Result<Option<LeaseRecord>> {
        let k = key.as_str();
        for _ in 0..RACES {
            let rows = self
                .query(&self.sql.force, &[&k, &self.channel, &k, &who])
                .await?;
            let Some(r) = rows.first() else {
                return Ok(None);
            };
            let done: bool = r.try_get(0).map_err(|e| self.err(e))?;
            if done {
                return self.full_record(r, 1, k).map(Some);
            }
        }
        Err(self.kept_changing(k))
    }

    /// The error of a step whose key kept changing under it.
    pub(super) fn kept_changing(&self, key: &str) -> Error {
        Error::Store {
            source: None,
            store: self.link.shown().to_owned(),
            detail: format!("the row of {key} kept changing while it was written"),
            retryable: true,
        }
    }
}

/// A lock request on a permit key that has holders or waiters: refused.
pub(super) fn lock_refused(key: &Key, is: &str) -> Error {
    mismatch(key.as_str(), is, "a lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_back_and_unknown_ones_are_refused() {
        assert_eq!(kind_of(None, Some(3)), Ok(None));
        assert_eq!(
            kind_of(Some("semaphore"), Some(3)),
            Ok(Some(PermitKind::Semaphore { permits: 3 }))
        );
        assert_eq!(
            kind_of(Some("read-write"), None),
            Ok(Some(PermitKind::ReadWrite))
        );
        assert!(kind_of(Some("semaphore"), None).is_err());
        assert!(kind_of(Some("semaphore"), Some(0)).is_err());
        assert!(kind_of(Some("mutex"), None).is_err());
        for kind in [PermitKind::Semaphore { permits: 2 }, PermitKind::ReadWrite] {
            let count = match kind {
                PermitKind::Semaphore { permits } => i32::try_from(permits).ok(),
                PermitKind::ReadWrite => None,
            };
            assert_eq!(kind_of(Some(kind_name(kind)), count), Ok(Some(kind)));
        }
    }

    #[test]
    fn holder_rows_read_back() {
        let json = r#"[{"holder":"a","token":"t","fence":7,"write":true,"acquired":1,
            "renewed":2,"expires":3,"ttl_ms":4,"pid":null,"host":"h","labels":"{\"x\":\"y\"}"},
            {"holder":"b","token":"u","fence":8,"write":false,"acquired":1,"renewed":2,
            "expires":3,"ttl_ms":4,"pid":-1,"host":null,"labels":"not json"}]"#;
        let rows: Vec<HolderRow> = serde_json::from_str(json).unwrap_or_default();
        let permits: Vec<Permit> = rows.into_iter().map(Permit::from).collect();
        assert_eq!(permits.len(), 2);
        assert_eq!((permits[0].fence, permits[0].write), (7, true));
        assert_eq!(permits[0].labels.get("x").map(String::as_str), Some("y"));
        assert_eq!((permits[1].pid, permits[1].labels.len()), (None, 0));
    }
}
