//! The keys this store wrote and still holds (lease records and waiter registrations), each with
//! its own deadline on this process's monotonic clock.
//!
//! A session lease outlives the keys attached to it; a key whose holder stops renewing (its
//! guard renews no more, a raw acquisition is never renewed) is deleted here at its deadline —
//! `sent + ttl` of its last grant or renewal, never before the holder's own stop-by time — with a
//! delete conditioned on its create revision, so that only that lease goes.

use super::error::retried;
use super::session::Session;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// One held key.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The owner token.
    pub(crate) token: String,
    /// The key's create revision (the lease it stands for).
    pub(crate) create_rev: i64,
    /// The session it is attached to.
    pub(crate) session: Arc<Session>,
    /// Deleted at this time unless renewed before.
    deadline: Instant,
}

/// The held keys of one store, by etcd key.
pub(crate) struct Held {
    map: Mutex<HashMap<String, Entry>>,
    client: etcd_client::Client,
    described: String,
    timeout: Duration,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("keys", &self.map.lock().len())
            .finish()
    }
}

impl Held {
    pub(crate) fn new(client: etcd_client::Client, described: String, timeout: Duration) -> Self {
        Held {
            map: Default::default(),
            client,
            described,
            timeout,
        }
    }

    /// Records `name` as held under `token` (created at `create_rev`, on `session`) until
    /// `deadline`, and arms its deletion then.
    pub(crate) fn insert(
        self: &Arc<Self>,
        name: &str,
        token: &str,
        create_rev: i64,
        session: Arc<Session>,
        deadline: Instant,
    ) {
        let entry = Entry {
            token: token.to_owned(),
            create_rev,
            session,
            deadline,
        };
        self.map.lock().insert(name.to_owned(), entry);
        tokio::spawn(sweep(
            Arc::downgrade(self),
            name.to_owned(),
            token.to_owned(),
        ));
    }

    /// The entry of `name` if it is held under `token`.
    pub(crate) fn get(&self, name: &str, token: &str) -> Option<Entry> {
        self.map
            .lock()
            .get(name)
            .filter(|e| e.token == token)
            .cloned()
    }

    /// Moves the deadline of `name` (held under `token`) to `deadline`, and its session to
    /// `session` when given; false when it is no longer held.
    pub(crate) fn extend(
        &self,
        name: &str,
        token: &str,
        deadline: Instant,
        session: Option<Arc<Session>>,
    ) -> bool {
        let mut map = self.map.lock();
        match map.get_mut(name) {
            Some(e) if e.token == token => {
                e.deadline = e.deadline.max(deadline);
                if let Some(s) = session {
                    e.session = s;
                }
                true
            }
            _ => false,
        }
    }

    /// Forgets `name` if it is held under `token`; its entry, if it was.
    pub(crate) fn remove(&self, name: &str, token: &str) -> Option<Entry> {
        let mut map = self.map.lock();
        match map.get(name) {
            Some(e) if e.token == token => map.remove(name),
            _ => None,
        }
    }

    /// Deletes `name` (held under `token`) now, whoever asked: a release whose delete failed
    /// leaves it to this, retried while its session lives.
    pub(crate) fn delete_soon(self: &Arc<Self>, name: &str, token: &str) {
        if let Some(e) = self.remove(name, token) {
            let (held, name) = (Arc::downgrade(self), name.to_owned());
            tokio::spawn(async move {
                delete_until_done(held, &name, e.create_rev, &e.session).await;
            });
        }
    }

    /// Checks, at `at`, on a write of `name` under `token` that got no answer (see
    /// [`unanswered`]).
    pub(crate) fn unanswered(
        self: &Arc<Self>,
        name: &str,
        token: &str,
        at: Instant,
        session: Arc<Session>,
    ) {
        tokio::spawn(unanswered(
            Arc::downgrade(self),
            name.to_owned(),
            token.to_owned(),
            at,
            session,
        ));
    }

    /// Deletes `name` if its create revision is still `create_rev`; whether it did.
    pub(crate) async fn delete_if(&self, name: &str, create_rev: i64) -> crate::Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(name, CompareOp::Equal, create_rev)])
            .and_then([TxnOp::delete(name, None)]);
        let r = retried(&self.described, self.timeout, || {
            let (mut client, txn) = (self.client.clone(), txn.clone());
            async move { client.txn(txn).await }
        })
        .await?;
        Ok(r.succeeded())
    }
}

/// Deletes `name` (held under `token`) once its deadline passes unrenewed; ends when it is
/// released or taken over, or the store is gone (its session leases then end).
async fn sweep(held: Weak<Held>, name: String, token: String) {
    loop {
        let deadline = {
            let Some(h) = held.upgrade() else { return };
            let map = h.map.lock();
            match map.get(&name) {
                Some(e) if e.token == token => e.deadline,
                _ => return,
            }
        };
        tokio::time::sleep_until(deadline).await;
        let Some(h) = held.upgrade() else { return };
        let entry = {
            let mut map = h.map.lock();
            match map.get(&name) {
                Some(e) if e.token == token && e.deadline <= Instant::now() => map.remove(&name),
                Some(e) if e.token == token => continue,
                _ => return,
            }
        };
        if let Some(e) = entry {
            drop(h);
            delete_until_done(held, &name, e.create_rev, &e.session).await;
        }
        return;
    }
}

/// Deletes `name` if its create revision is still `create_rev`, retrying while the store exists
/// and `session` (which keeps the key) is alive: a key left there would stay for the session's
/// life.
async fn delete_until_done(held: Weak<Held>, name: &str, create_rev: i64, session: &Session) {
    let mut pause = Duration::from_millis(100);
    loop {
        let Some(h) = held.upgrade() else { return };
        match h.delete_if(name, create_rev).await {
            Ok(_) => return,
            Err(e) => {
                if matches!(
                    session.vouch(Instant::now()),
                    super::session::Vouch::Dead(_)
                ) {
                    return;
                }
                tracing::debug!(key = %name, error = %e, "could not delete an expired lease; retrying");
            }
        }
        drop(h);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// After a write of `name` under `token` that got no answer (it may have been done): at `at`,
/// unless the key is held here by then (a later attempt found it granted), deletes it if it
/// holds `token`, retrying while `session` lives.
async fn unanswered(
    held: Weak<Held>,
    name: String,
    token: String,
    at: Instant,
    session: Arc<Session>,
) {
    tokio::time::sleep_until(at).await;
    let mut pause = Duration::from_millis(100);
    loop {
        let Some(h) = held.upgrade() else { return };
        if h.get(&name, &token).is_some() {
            return;
        }
        let read = retried(&h.described, h.timeout, || {
            let (mut client, name) = (h.client.clone(), name.clone());
            async move { client.get(name, None).await }
        })
        .await;
        match read {
            Ok(mut r) => {
                let Some(kv) = r.take_kvs().into_iter().next() else {
                    return;
                };
                let ours = std::str::from_utf8(kv.value())
                    .is_ok_and(|v| v.contains(&format!("\"{token}\"")));
                if !ours || h.get(&name, &token).is_some() {
                    return;
                }
                drop(h);
                return delete_until_done(held, &name, kv.create_revision(), &session).await;
            }
            Err(e) => {
                if matches!(
                    session.vouch(Instant::now()),
                    super::session::Vouch::Dead(_)
                ) {
                    return;
                }
                tracing::debug!(key = %name, error = %e, "could not read a key written without answer; retrying");
            }
        }
        drop(h);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
