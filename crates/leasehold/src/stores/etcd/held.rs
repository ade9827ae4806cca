//! The keys this store wrote and still holds (lease records and waiter registrations), each with
//! its own deadline on this process's monotonic clock.
//!
//! A session lease outlives the keys attached to it; a key whose holder stops renewing (its
//! guard renews no more, a raw acquisition is never renewed) is deleted here at its deadline —
//! `sent + ttl` of its last grant or renewal, never before the holder's own stop-by time — with a
//! delete conditioned on its create revision, so that only that lease goes.
//!
//! A write sent without an answer (a timeout: done or not, nobody knows) is kept here too, by its
//! exact value (each write's value is unique, see [`next_write`]). Two parties may act on it: a
//! retry of the same acquisition that finds it may *adopt* it as its grant, and its clean-up
//! deletes it a TTL after it was sent. They are exclusive, decided under the one lock of this
//! map: a write is adoptable only until its clean-up claims it, and a clean-up claims only a
//! write not adopted. A claimed write stays claimed (its delete may still land late), so no
//! retry ever adopts a key that a clean-up might delete.

use super::error::retried;
use super::session::Session;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// A number no other write of this process carries: written into each value this store writes
/// (beside its owner token, unique per acquisition), so that a value names one write.
pub(crate) fn next_write() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A clean-up that did not find its write looks again (the write may still land: a request
/// whose answer was lost can be applied late, after a leader change) after this, then at
/// doubling pauses until [`RECHECK_UNTIL`] has passed.
const RECHECK_FIRST: Duration = Duration::from_secs(1);
/// How long a clean-up looks for a write it did not find.
const RECHECK_UNTIL: Duration = Duration::from_secs(60);

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

/// A write sent without an answer.
#[derive(Debug)]
struct Unanswered {
    name: String,
    token: String,
    /// Its exact value.
    value: Vec<u8>,
    /// The session it was attached to.
    session: Arc<Session>,
    /// Its clean-up has begun: it can no longer be adopted.
    claimed: bool,
}

/// What one store holds, under one lock.
#[derive(Default)]
struct State {
    /// The held keys, by etcd key.
    keys: HashMap<String, Entry>,
    /// Writes without an answer, by a number of their own.
    unanswered: HashMap<u64, Unanswered>,
    /// The held permit keys (names under [`Held::indexed`]) by owner token.
    by_token: HashMap<String, String>,
}

impl State {
    /// Forgets held key `name`; its entry, if it had one.
    fn take(&mut self, name: &str) -> Option<Entry> {
        let e = self.keys.remove(name)?;
        if self.by_token.get(&e.token).is_some_and(|n| n == name) {
            self.by_token.remove(&e.token);
        }
        Some(e)
    }
}

/// The held keys of one store, by etcd key.
pub(crate) struct Held {
    map: Mutex<State>,
    /// Held keys whose names start with this are found by token ([`Held::by_token`]).
    indexed: String,
    client: etcd_client::Client,
    described: String,
    timeout: Duration,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("keys", &self.map.lock().keys.len())
            .finish()
    }
}

impl Held {
    pub(crate) fn new(
        client: etcd_client::Client,
        described: String,
        timeout: Duration,
        indexed: String,
    ) -> Self {
        Held {
            map: Default::default(),
            indexed,
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
        Self::insert_in(
            &mut self.map.lock(),
            &self.indexed,
            name,
            token,
            create_rev,
            session,
            deadline,
        );
        self.sweep_at_deadline(name, token);
    }

    fn insert_in(
        state: &mut State,
        indexed: &str,
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
        state.take(name);
        state.keys.insert(name.to_owned(), entry);
        if name.starts_with(indexed) {
            state.by_token.insert(token.to_owned(), name.to_owned());
        }
    }

    fn sweep_at_deadline(self: &Arc<Self>, name: &str, token: &str) {
        tokio::spawn(sweep(
            Arc::downgrade(self),
            name.to_owned(),
            token.to_owned(),
        ));
    }

    /// Takes the write of `name` with `value` (created at `create_rev`, on `session`) as held
    /// under `token` until `deadline`, if it is a write of ours that got no answer and whose
    /// clean-up has not begun; whether it did. (Then its clean-up does nothing.)
    pub(crate) fn adopt(
        self: &Arc<Self>,
        name: &str,
        token: &str,
        value: &[u8],
        create_rev: i64,
        session: Arc<Session>,
        deadline: Instant,
    ) -> bool {
        {
            let mut state = self.map.lock();
            let Some(id) = state
                .unanswered
                .iter()
                .find(|(_, u)| !u.claimed && u.name == name && u.token == token && u.value == value)
                .map(|(id, _)| *id)
            else {
                return false;
            };
            state.unanswered.remove(&id);
            Self::insert_in(
                &mut state,
                &self.indexed,
                name,
                token,
                create_rev,
                session,
                deadline,
            );
        }
        self.sweep_at_deadline(name, token);
        true
    }

    /// The entry of `name` if it is held under `token`.
    pub(crate) fn get(&self, name: &str, token: &str) -> Option<Entry> {
        self.map
            .lock()
            .keys
            .get(name)
            .filter(|e| e.token == token)
            .cloned()
    }

    /// The held permit key (a name under the indexed prefix) starting with `under` that `token`
    /// holds, and its entry.
    pub(crate) fn by_token(&self, under: &str, token: &str) -> Option<(String, Entry)> {
        let state = self.map.lock();
        let name = state.by_token.get(token).filter(|n| n.starts_with(under))?;
        let e = state.keys.get(name).filter(|e| e.token == token)?;
        Some((name.clone(), e.clone()))
    }

    /// Whether a permit key (a name under the indexed prefix) starting with `under` was written
    /// under `token` without an answer, and may still be adopted.
    pub(crate) fn unanswered_under(&self, under: &str, token: &str) -> bool {
        self.map
            .lock()
            .unanswered
            .values()
            .any(|u| !u.claimed && u.token == token && u.name.starts_with(under))
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
        let mut state = self.map.lock();
        match state.keys.get_mut(name) {
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
        let mut state = self.map.lock();
        match state.keys.get(name) {
            Some(e) if e.token == token => state.take(name),
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

    /// Records a write of `value` to `name` under `token`, on `session`, that got no answer: a
    /// retry may [`adopt`](Self::adopt) it until `at`, when its clean-up claims it and deletes
    /// it if it is there (see [`clean_up`]).
    pub(crate) fn unanswered(
        self: &Arc<Self>,
        name: &str,
        token: &str,
        value: Vec<u8>,
        at: Instant,
        session: Arc<Session>,
    ) {
        let id = next_write();
        self.map.lock().unanswered.insert(
            id,
            Unanswered {
                name: name.to_owned(),
                token: token.to_owned(),
                value,
                session,
                claimed: false,
            },
        );
        tokio::spawn(clean_up(Arc::downgrade(self), id, at));
    }

    /// Deletes `name` if its create revision is still `create_rev`; whether it did.
    pub(crate) async fn delete_if(
        &self,
        name: &str,
        create_rev: i64,
    ) -> crate::error::Result<bool> {
        let compare = Compare::create_revision(name, CompareOp::Equal, create_rev);
        self.delete_when(name, compare).await
    }

    /// Deletes `name` if `compare` holds; whether it did.
    async fn delete_when(&self, name: &str, compare: Compare) -> crate::error::Result<bool> {
        let txn = Txn::new()
            .when([compare])
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
            let state = h.map.lock();
            match state.keys.get(&name) {
                Some(e) if e.token == token => e.deadline,
                _ => return,
            }
        };
        tokio::time::sleep_until(deadline).await;
        let Some(h) = held.upgrade() else { return };
        let entry = {
            let mut state = h.map.lock();
            match state.keys.get(&name) {
                Some(e) if e.token == token && e.deadline <= Instant::now() => state.take(&name),
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

/// The clean-up of unanswered write `id`: at `at`, unless a retry adopted it by then, claims it
/// (no retry adopts it from then on) and deletes its key if it still holds exactly that write,
/// retrying while its session lives. A write not found is looked for again for a while (it may
/// land late); then it is forgotten, still unadoptable.
async fn clean_up(held: Weak<Held>, id: u64, at: Instant) {
    tokio::time::sleep_until(at).await;
    let (name, value, session) = {
        let Some(h) = held.upgrade() else { return };
        let mut state = h.map.lock();
        let Some(u) = state.unanswered.get_mut(&id) else {
            return; // adopted
        };
        u.claimed = true;
        (u.name.clone(), u.value.clone(), u.session.clone())
    };
    let forget = || {
        if let Some(h) = held.upgrade() {
            h.map.lock().unanswered.remove(&id);
        }
    };
    let started = Instant::now();
    let (mut backoff, mut recheck) = (Duration::from_millis(100), RECHECK_FIRST);
    loop {
        let Some(h) = held.upgrade() else { return };
        let compare = Compare::value(name.as_str(), CompareOp::Equal, value.clone());
        let pause = match h.delete_when(&name, compare).await {
            Ok(true) => return forget(),
            Ok(false) if started.elapsed() >= RECHECK_UNTIL => return forget(),
            Ok(false) => {
                let wait = recheck;
                recheck *= 2;
                wait
            }
            Err(e) => {
                tracing::debug!(key = %name, error = %e, "could not delete a key written without answer; retrying");
                let wait = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                wait
            }
        };
        drop(h);
        if matches!(
            session.vouch(Instant::now()),
            super::session::Vouch::Dead(_)
        ) {
            // Its keys went with it.
            return forget();
        }
        tokio::time::sleep(pause).await;
    }
}
