//! Session leases: one etcd lease per store and lease-time class, kept alive by one keep-alive
//! stream, that every key the store writes for that class is attached to.
//!
//! A session is surely alive until `sent + TTL − drift` on this process's monotonic clock, where
//! `sent` is when the last keep-alive that etcd answered was sent: etcd counts the TTL from when
//! its leader received it, which is later. A renewal of a key says "renewed for `ttl`" only when
//! the session is surely alive for that long, so a guard's stop-by deadline always falls before
//! etcd could expire the session and free its keys for another process.

use super::error::retried;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// The etcd lease TTL (whole seconds) of the session that carries keys held for `ttl`: long
/// enough that a session kept alive every quarter of it always vouches for `ttl` more (at least
/// 1.5 × `ttl`, plus a second for late keep-alives), and at least 2 s (etcd's smallest lease).
pub(crate) fn lease_secs(ttl: Duration) -> i64 {
    let wanted = ttl.as_secs_f64() * 1.5;
    (wanted.ceil() as i64 + 1).max(2)
}

/// One session lease.
#[derive(Debug)]
pub(crate) struct Session {
    /// The etcd lease id.
    pub(crate) id: i64,
    /// Its TTL as etcd granted it.
    pub(crate) ttl: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Surely alive until then.
    valid_until: Instant,
    /// Why it is gone, once it is.
    dead: Option<String>,
}

/// What a session can vouch for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Vouch {
    /// Alive for as long as asked.
    Alive,
    /// Alive, but its keep-alives are late: not surely for as long as asked.
    Late(String),
    /// Gone (expired, revoked, or unconfirmed past its TTL): its keys are, or will be, deleted.
    Dead(String),
}

impl Session {
    fn new(id: i64, ttl: Duration, sent: Instant) -> Self {
        Session {
            id,
            ttl,
            state: Mutex::new(State {
                valid_until: sent + ttl.saturating_sub(crate::options::drift(ttl)),
                dead: None,
            }),
        }
    }

    /// Whether the session is surely alive until `until`.
    pub(crate) fn vouch(&self, until: Instant) -> Vouch {
        let s = self.state.lock();
        if let Some(why) = &s.dead {
            return Vouch::Dead(why.clone());
        }
        let now = Instant::now();
        if s.valid_until <= now {
            return Vouch::Dead(format!(
                "the session lease (etcd lease {:x}) was not kept alive within its {:?} TTL",
                self.id, self.ttl
            ));
        }
        if s.valid_until < until {
            return Vouch::Late(format!(
                "the session lease's keep-alive is late (surely alive for {:?} more)",
                s.valid_until - now
            ));
        }
        Vouch::Alive
    }

    fn confirmed(&self, sent: Instant, ttl: Duration) {
        let mut s = self.state.lock();
        let until = sent + ttl.saturating_sub(crate::options::drift(ttl));
        if until > s.valid_until {
            s.valid_until = until;
        }
    }

    fn kill(&self, why: String) {
        let mut s = self.state.lock();
        if s.dead.is_none() {
            tracing::warn!(lease = self.id, reason = %why, "etcd session lost");
            s.dead = Some(why);
        }
    }

    fn is_dead(&self) -> bool {
        self.state.lock().dead.is_some()
    }
}

/// The sessions of one store, by lease-time class.
pub(crate) struct Sessions {
    client: etcd_client::Client,
    described: String,
    timeout: Duration,
    by_secs: tokio::sync::Mutex<HashMap<i64, Arc<Session>>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

impl Sessions {
    pub(crate) fn new(client: etcd_client::Client, described: String, timeout: Duration) -> Self {
        Sessions {
            client,
            described,
            timeout,
            by_secs: Default::default(),
        }
    }

    /// The live session for keys held for `ttl`, granted (and its keep-alive started) on first
    /// use and again after one was lost.
    ///
    /// # Errors
    /// The grant's error, or a retryable [`Error::Unavailable`] while the session's keep-alives
    /// are late (a key written now might outlive what the session vouches for).
    pub(crate) async fn for_ttl(&self, ttl: Duration) -> Result<Arc<Session>> {
        let secs = lease_secs(ttl);
        let mut map = self.by_secs.lock().await;
        if let Some(s) = map.get(&secs) {
            match s.vouch(Instant::now() + ttl) {
                Vouch::Alive => return Ok(s.clone()),
                Vouch::Late(why) => return Err(Error::unavailable(&self.described, why)),
                Vouch::Dead(_) => {}
            }
        }
        let sent = Instant::now();
        let granted = retried(&self.described, self.timeout, || {
            let mut client = self.client.clone();
            async move { client.lease_grant(secs, None).await }
        })
        .await?;
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let session = Arc::new(Session::new(granted.id(), ttl, sent));
        tokio::spawn(keep_alive(
            Arc::downgrade(&session),
            session.id,
            self.client.clone(),
            self.timeout,
        ));
        map.insert(secs, session.clone());
        Ok(session)
    }
}

/// Keeps session `id` alive every quarter of its TTL on one keep-alive stream (opened again after
/// a failure, retried every 100 ms) until the session is gone or dropped; a dropped session's
/// lease is revoked, which frees whatever keys are still attached to it.
async fn keep_alive(
    session: Weak<Session>,
    id: i64,
    mut client: etcd_client::Client,
    timeout: Duration,
) {
    let mut stream = None;
    let mut next = Instant::now();
    loop {
        tokio::time::sleep_until(next).await;
        let Some(s) = session.upgrade() else {
            let _ = tokio::time::timeout(timeout, client.lease_revoke(id)).await;
            return;
        };
        if s.is_dead() {
            return;
        }
        let period = s.ttl / 4;
        let sent = Instant::now();
        if stream.is_none() {
            stream = tokio::time::timeout(timeout, client.lease_keep_alive(id))
                .await
                .ok()
                .and_then(|r| r.ok());
        }
        let answer = match &mut stream {
            Some((keeper, responses)) => {
                let exchange = async {
                    keeper.keep_alive().await?;
                    responses.message().await
                };
                tokio::time::timeout(timeout, exchange).await.ok()
            }
            None => None,
        };
        match answer {
            Some(Ok(Some(r))) if r.ttl() > 0 => {
                s.confirmed(sent, Duration::from_secs(r.ttl() as u64));
                next = sent + period;
            }
            Some(Ok(Some(_))) => {
                s.kill(format!(
                    "the session lease (etcd lease {id:x}) expired or was revoked"
                ));
                return;
            }
            _ => {
                stream = None;
                if let Vouch::Dead(why) = s.vouch(Instant::now()) {
                    s.kill(why);
                    return;
                }
                next = Instant::now() + Duration::from_millis(100).min(period);
            }
        }
    }
}
