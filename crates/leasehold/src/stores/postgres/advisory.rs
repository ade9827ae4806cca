//! `?mode=advisory`: besides its row, a held lease holds a session advisory lock
//! (`pg_try_advisory_lock` on a 64-bit hash of the table and the key), which the server frees
//! when the holder's connection ends, so a contender takes over a dead process's lease at once
//! rather than after its TTL.
//!
//! Multiplexed: one session connection per store holds the advisory locks of all the store's
//! leases (not one pinned connection per lease). Session locks are re-entrant within their
//! session, so the store keeps a map of the keys it holds there: a key it holds already is decided
//! by its row alone (expiry, as in table mode), and only a key it does not hold asks the server
//! for the lock. Granted with the lock, the row is taken whatever its expiry (its holder's session
//! is gone); refused it, the row is not taken (the holder lives), only a waiter registered.

use super::Inner;
use crate::error::Result;
use crate::postgres::link::{Link, Live};
use crate::store::{AcquireOutcome, AcquireRequest, ReleaseOutcome};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// The advisory lock of `key` in the table named `table`: the first 8 bytes of
/// SHA-256(`table` NUL `key`), as a signed 64-bit number.
pub(super) fn lock_id(table: &str, key: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(table.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

/// A key this store holds on its session.
#[derive(Debug)]
struct Entry {
    /// The owner token of the lease that holds it (`None`: taken by an acquisition that was
    /// cancelled before it knew its outcome).
    token: Option<String>,
    /// The session the advisory lock is held on.
    session: Arc<Live>,
}

/// How many stripes serialise one store's advisory steps per key.
const STRIPES: usize = 64;

/// The session connection and the keys held on it.
#[derive(Debug)]
pub(super) struct Advisory {
    session: Link,
    held: parking_lot::Mutex<HashMap<String, Entry>>,
    /// One store's acquisitions and releases of a key, one at a time (striped by key): the map
    /// and the session's lock change together.
    stripes: Vec<tokio::sync::Mutex<()>>,
}

impl Advisory {
    pub(super) fn new(session: Link) -> Self {
        Advisory {
            session,
            held: parking_lot::Mutex::default(),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    /// Whether `token` holds `key` on a session that still lives (`None`: not held here).
    pub(super) fn holds(&self, key: &str, token: &str) -> Option<bool> {
        let held = self.held.lock();
        let e = held.get(key)?;
        (e.token.as_deref() == Some(token)).then(|| e.session.alive())
    }

    fn stripe(&self, id: i64) -> &tokio::sync::Mutex<()> {
        &self.stripes[(id as u64 % STRIPES as u64) as usize]
    }
}

/// Runs the one-value query `sql` (`$1` = `id`) on the session connection: its answer, and the
/// session it ran on.
async fn on_session(a: &Advisory, sql: &'static str, id: i64) -> Result<(bool, Arc<Live>)> {
    a.session
        .call(|l| async move {
            let row = l.conn.prepared.query(&l.conn.client, sql, &[&id]).await?;
            let got = row.first().map(|r| r.try_get::<_, bool>(0)).transpose()?;
            Ok((got.unwrap_or(false), l))
        })
        .await
}

/// Acquires in advisory mode (see the module docs).
pub(super) async fn acquire(
    inner: &Inner,
    a: &Advisory,
    req: &AcquireRequest,
    labels: &str,
) -> Result<AcquireOutcome> {
    let key = req.key.as_str();
    let id = lock_id(&inner.sql.table, key);
    let _one = a.stripe(id).lock().await;
    let ours = {
        let mut held = a.held.lock();
        match held.get(key) {
            Some(e) if e.session.alive() => true,
            Some(_) => {
                // Its session ended: the server freed the lock.
                held.remove(key);
                false
            }
            None => false,
        }
    };
    if ours {
        // Our session holds the key's lock already: the row decides, by expiry.
        let out = inner.acquire_row(req, labels, 0).await?;
        if let AcquireOutcome::Granted(_) = out {
            if let Some(e) = a.held.lock().get_mut(key) {
                e.token = Some(req.token.clone());
            }
        }
        return Ok(out);
    }
    let (got, session) = on_session(a, "SELECT pg_try_advisory_lock($1)", id).await?;
    if !got {
        return inner.acquire_row(req, labels, 2).await;
    }
    a.held.lock().insert(
        key.to_owned(),
        Entry {
            token: None,
            session,
        },
    );
    let out = inner.acquire_row(req, labels, 1).await;
    match &out {
        Ok(AcquireOutcome::Granted(_)) => {
            if let Some(e) = a.held.lock().get_mut(key) {
                e.token = Some(req.token.clone());
            }
        }
        _ => {
            a.held.lock().remove(key);
            let _ = on_session(a, "SELECT pg_advisory_unlock($1)", id).await;
        }
    }
    out
}

/// Releases in advisory mode: the advisory lock first (if this lease holds it), then the row.
pub(super) async fn release(
    inner: &Inner,
    a: &Advisory,
    key: &str,
    token: &str,
) -> Result<ReleaseOutcome> {
    let id = lock_id(&inner.sql.table, key);
    let _one = a.stripe(id).lock().await;
    let unlocked = unlock(a, id, key, token).await;
    let row = inner.release_row(key, token).await?;
    Ok(if unlocked {
        ReleaseOutcome::Released
    } else {
        row
    })
}

/// Frees the advisory lock the lease of `token` holds on `key`, after a renewal found the lease
/// lost.
pub(super) async fn forget(inner: &Inner, a: &Advisory, key: &str, token: &str) {
    let id = lock_id(&inner.sql.table, key);
    let _one = a.stripe(id).lock().await;
    unlock(a, id, key, token).await;
}

/// Unlocks `key` (lock `id`) if the lease of `token` holds it (or an acquisition cancelled
/// before it knew its outcome took it): whether it did, on a session that still lives.
async fn unlock(a: &Advisory, id: i64, key: &str, token: &str) -> bool {
    let entry = {
        let mut held = a.held.lock();
        match held.get(key) {
            Some(e) if e.token.as_deref().map_or(true, |t| t == token) => held.remove(key),
            _ => None,
        }
    };
    if !entry.is_some_and(|e| e.session.alive()) {
        return false;
    }
    matches!(
        on_session(a, "SELECT pg_advisory_unlock($1)", id).await,
        Ok((true, _))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ids_depend_on_table_and_key() {
        let a = lock_id("\"public\".\"t\"", "k");
        assert_eq!(a, lock_id("\"public\".\"t\"", "k"));
        assert_ne!(a, lock_id("\"public\".\"t\"", "k2"));
        assert_ne!(a, lock_id("\"public\".\"u\"", "k"));
    }
}
