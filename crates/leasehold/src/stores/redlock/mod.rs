//! The Redlock store (`redlock://host1:port1,host2:port2,host3:port3[/db][?timeout=200ms]`): N
//! independent Redis masters and the Redlock algorithm.
//!
//! Checklist — native TTL: yes (per node); watch: yes (pub/sub on every node, any wakes);
//! liveness: no; fence: the **maximum** of the per-node `INCR` fences over the majority that
//! granted the lease.
//!
//! # Algorithm
//! * **Acquire**: the acquire script of the [Redis store](crate::stores::redis) runs on all nodes at once
//!   with the same owner token and a short per-node timeout (default 200 ms, `?timeout=`). The lease
//!   is ours only if a majority (`N/2 + 1`) granted it and the remaining validity
//!   `TTL − elapsed − drift` (drift = `TTL × 0.01 + 2 ms`) is positive; every node's answer (or
//!   timeout) is awaited, so that the lease is on every node that could take it. Otherwise it is
//!   released on every node and the answer is "held" (waiters retry with jittered backoff) —
//!   or, if fewer than a majority of nodes answered at all, an [`Error::Unavailable`] naming the
//!   unreachable nodes (a non-retryable [`Error::Store`] instead when too many of them failed in a
//!   way retrying cannot heal: a wrong password, a missing ACL permission).
//! * **Fence**: per-node counters drift apart (a node that refused a contender, or a minority grant
//!   undone, still counted), so the granted fence is the maximum over the granting majority, and
//!   before the lease is returned every granting node whose counter lags is raised to it (one more
//!   round trip, only when the counters differ), and so is every node that answered but refused.
//!   Any later majority then shares a node whose counter is at least that fence, so the next fence
//!   is higher: strictly increasing across holders — unless that shared node restarted empty
//!   meanwhile and the other did not answer at the grant (two faulty nodes of three).
//! * **Renew** runs on all nodes; it succeeds with a majority of renewals. When a majority refuses,
//!   the lease is lost; when too few nodes answer, the renewal is retried until the lease's validity
//!   runs out, and then `lost()` fires.
//! * **Release** runs on all nodes and answers when every node answered or timed out.
//! * **A hung node** (one that let a call run out of time) is left out of every call while the
//!   others make a majority, until it answers a `PING` in time, so it costs one timeout, not one
//!   per call. Taken back, it has missed what happened meanwhile, as a node restarted empty has.
//!
//! # Where the guarantees end
//! Mutual exclusion needs a majority of nodes to remember the lease for its TTL. A node restarted
//! **empty** (no persistence) while a lease is held forgets it: with one such node of three nothing
//! happens (the other two still refuse everyone else), but if a majority of nodes lost their data, a
//! second holder can be granted the lease while the first still holds it — and its fence comes from
//! counters that restarted at zero, so it is **lower** than the first holder's. A resource that
//! rejects fences lower than the highest it has seen rejects that second holder's writes; this is
//! the one case where a Redlock fence goes backwards, and `tests/redlock_faults.rs` shows it.
//! Run nodes with persistence (`appendonly yes`, `appendfsync always`) or delay restarts by the
//! longest TTL, as the Redlock description recommends, to avoid it.

use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, LostReason, ReleaseOutcome, RenewOutcome,
};
use crate::stores::redis::RedisStore;
mod floor;
mod options;
pub use options::RedlockOptions;

use async_trait::async_trait;
use futures_util::future::{join_all, select_all};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The Redlock store; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct RedlockStore {
    nodes: Vec<(String, RedisStore)>,
    quorum: usize,
    timeout: Duration,
    described: String,
    /// Per node (in `nodes`' order): whether it is left out (see [`RedlockStore::all`]).
    health: Arc<[Health]>,
}

/// Whether a node is left out, and whether a probe of it is under way (one at a time).
#[derive(Debug, Default)]
struct Health {
    out: AtomicBool,
    probing: AtomicBool,
}

impl RedlockStore {
    /// A store over the nodes of `options`. Nodes are connected on first use, so a node that is
    /// down at start does not prevent a majority from working.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a bad node URL; [`Error::InvalidOption`] for no nodes, or for
    /// replicas to wait for.
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use leasehold::stores::redlock::{RedlockOptions, RedlockStore};
    /// let nodes = ["10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"].map(|n| format!("redis://{n}/0"));
    /// let store = RedlockStore::connect(RedlockOptions::new(nodes)).await?;
    /// assert_eq!(store.quorum(), 2);
    /// // The same as `leasehold::connect("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/0")`.
    /// # Ok(()) }
    /// ```
    pub async fn connect(options: RedlockOptions) -> Result<Self> {
        let RedlockOptions { nodes: urls, node } = options;
        if urls.is_empty() {
            return Err(Error::option(
                "nodes",
                "Redlock needs at least one node (three or five are usual)",
            ));
        }
        node.no_replicas()?;
        let mut nodes = vec![];
        for u in &urls {
            nodes.push((
                crate::url::redact(u),
                RedisStore::connect_inner(u, node.clone(), true).await?,
            ));
        }
        let names: Vec<&str> = nodes.iter().map(|(n, _)| n.as_str()).collect();
        let described = format!("redlock({})", names.join(","));
        Ok(RedlockStore {
            quorum: nodes.len() / 2 + 1,
            health: nodes.iter().map(|_| Health::default()).collect(),
            nodes,
            timeout: node.timeout,
            described,
        })
    }

    /// The first node (there is always one), whose calls every node can be sent.
    fn first(&self) -> &RedisStore {
        &self.nodes[0].1
    }

    /// The number of nodes that must agree.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Runs `f` on every node at once, each bounded by the per-node timeout.
    ///
    /// A node that lets a call run out of time (a hung server, a partition that drops packets) is
    /// then **left out**: it is sent no calls and not waited for, as long as the other nodes can
    /// still make a majority, until it answers a `PING` in time (probed in the background: a
    /// `PING` bounded by the timeout, then a pause as long). Otherwise one hung node of three
    /// would add the whole timeout to every acquire, renewal and release. It answers as a node that is down (an [`Error::Unavailable`]), which
    /// is what waiting for it would have given. When too many nodes are out for a majority
    /// without them, every node is sent the call and waited for, as before.
    async fn all<'a, T, F, Fut>(&'a self, f: F) -> Vec<(&'a str, Result<T>)>
    where
        F: Fn(&'a RedisStore) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let out: Vec<bool> = self
            .health
            .iter()
            .map(|h| h.out.load(Ordering::Relaxed))
            .collect();
        let skip = self.nodes.len() - out.iter().filter(|o| **o).count() >= self.quorum;
        let calls = self.nodes.iter().zip(out).enumerate().map(|(i, ((name, node), out))| {
            let fut = (!(skip && out)).then(|| f(node));
            async move {
                let r = match fut {
                    None => Err(Error::Unavailable {
                        source: None,
                        store: name.clone(),
                        detail: "left out: it let a call run out of time and has not answered a PING since".into(),
                    }),
                    Some(fut) => {
                        // The node's own bound (the same timeout) usually ends the call first.
                        let r = tokio::time::timeout(self.timeout, fut)
                            .await
                            .unwrap_or_else(|_| Err(Error::no_answer(name.clone())));
                        match &r {
                            Ok(_) if out => self.back(i),
                            Err(e) if e.is_no_answer() => self.leave_out(i),
                            _ => {}
                        }
                        r
                    }
                };
                (name.as_str(), r)
            }
        });
        join_all(calls).await
    }

    /// Leaves node `i` out after a call to it ran out of time, and probes it until it answers.
    fn leave_out(&self, i: usize) {
        let health = &self.health[i];
        if health.out.swap(true, Ordering::Relaxed) {
            return;
        }
        let (name, node) = self.nodes[i].clone();
        tracing::warn!(store = %self.described, node = %name, "a Redlock node did not answer in time; left out until it answers a PING");
        if !health.probing.swap(true, Ordering::Relaxed) {
            let (health, timeout) = (Arc::downgrade(&self.health), self.timeout);
            tokio::spawn(probe(health, i, name, node, timeout));
        }
    }

    /// Takes node `i` back after it answered a call.
    fn back(&self, i: usize) {
        if self.health[i].out.swap(false, Ordering::Relaxed) {
            tracing::info!(store = %self.described, node = %self.nodes[i].0, "a Redlock node answers again");
        }
    }

    /// Runs `f` on every node and keeps the answers; an error naming every node when none answered.
    async fn answers<'a, T, F, Fut>(&'a self, f: F) -> Result<Vec<T>>
    where
        F: Fn(&'a RedisStore) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let mut answers = vec![];
        let mut failed = vec![];
        for (name, r) in self.all(f).await {
            match r {
                Ok(v) => answers.push(v),
                Err(e) => failed.push((name, e)),
            }
        }
        if answers.is_empty() {
            return Err(self.too_few(0, &failed));
        }
        Ok(answers)
    }

    /// Too few nodes answered for a majority: [`Error::Unavailable`] naming each failed node and
    /// why — or, when the failed nodes that may come back (a retryable error) could not make a
    /// majority with those that answered even if they did (a wrong password, a missing
    /// permission), a non-retryable [`Error::Store`]: waiting would not help.
    fn too_few(&self, answered: usize, failures: &[(&str, Error)]) -> Error {
        let list: Vec<String> = failures.iter().map(|(n, e)| format!("{n} ({e})")).collect();
        let may_recover = failures.iter().filter(|(_, e)| e.is_retryable()).count();
        let (store, total, quorum) = (self.described.clone(), self.nodes.len(), self.quorum);
        if answered + may_recover < quorum {
            return Error::Store {
                source: None,
                store,
                detail: format!(
                    "only {answered} of {total} nodes answered, {quorum} needed, and retrying cannot help; failed: {}",
                    list.join("; ")
                ),
                retryable: false,
            };
        }
        Error::Unavailable {
            source: None,
            store,
            detail: format!(
                "only {answered} of {total} nodes answered, {quorum} needed; unreachable: {}",
                list.join("; ")
            ),
        }
    }
}

#[async_trait]
impl LockStore for RedlockStore {
    fn describe(&self) -> String {
        self.described.clone()
    }

    fn floor(&self) -> Option<Arc<dyn crate::floor::Floor>> {
        Some(Arc::new(floor::RedlockFloor::new(self)))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: true,
            watch: true,
            liveness: false,
            fence_source: "maximum of the per-node INCR fences over the granting majority",
            waiter_line: false,
            release_grants: false,
            permits: false,
            expiry_clock: crate::store::ExpiryClock::Server,
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        if let Some(p) = &req.permit {
            return Err(p.not_supported(&self.describe()));
        }
        req.check_size(super::redis::LABEL_LIMIT, &self.describe())?;
        let started = Instant::now();
        let mut granted: Vec<(&RedisStore, LeaseRecord)> = vec![];
        // The nodes that refused, with their records.
        let mut held: Vec<(&RedisStore, LeaseRecord)> = vec![];
        let mut failed: Vec<(&str, Error)> = vec![];
        // One call, built once, sent to every node (their prefixes are the same). Every node's
        // answer is awaited (or its timeout), not just a majority's: a lease granted by all the
        // nodes that could is what lets it survive one granting node restarting empty (answering
        // at a majority left a moment in which a restart let a second holder in; the test
        // `a_lease_holder_keeps_renewing_while_a_node_restarts_empty` caught it).
        let call = self.first().acquire_call(req, false);
        let answers = self
            .all(|n| async {
                let answer = n.call(&call).await?;
                n.acquire_answer(req, answer)
            })
            .await;
        for ((name, r), (_, node)) in answers.into_iter().zip(&self.nodes) {
            match r {
                Ok(AcquireOutcome::Granted(rec)) => granted.push((node, rec)),
                Ok(AcquireOutcome::Held(rec)) => held.push((node, rec)),
                Err(e) => failed.push((name, e)),
            }
        }
        if granted.len() >= self.quorum {
            let fence = granted.iter().map(|(_, r)| r.fence).max().unwrap_or(0);
            // Per-node counters drift apart (a node that refused, or a grant undone for want of a
            // majority, still counted). Raise every granting node that lags to `fence` before the
            // lease is ours: then any later majority meets a node at `fence` or above, and its fence
            // is higher — fences stay strictly increasing across holders.
            //
            // The nodes that answered but refused (a stale record, a waiter registered on that
            // node alone) are raised too, though the grant does not count on it (a refusing node
            // that hangs on the raise still adds up to one timeout): left behind, such
            // a node and one restarted empty could later make a majority whose fence is lower (the
            // fault harness, tests/chaos.rs, found it: the same fence granted twice). Only a node
            // that did not answer at all is left behind now; with another restarted empty, that is
            // two faulty nodes, more than three nodes tolerate.
            // (node, whether the grant needs it raised)
            let targets: Vec<(&RedisStore, bool)> = granted
                .iter()
                .filter(|(_, r)| r.fence < fence)
                .map(|(node, _)| (*node, true))
                .chain(held.iter().map(|(node, _)| (*node, false)))
                .collect();
            let raised = join_all(targets.iter().map(|(node, _)| {
                tokio::time::timeout(self.timeout, node.raise_fence(&req.key, fence))
            }))
            .await;
            let not_raised = targets
                .iter()
                .zip(&raised)
                .filter(|((_, needed), r)| *needed && !matches!(r, Ok(Ok(()))))
                .count();
            let drift = crate::options::drift(req.ttl);
            let valid = req
                .ttl
                .checked_sub(started.elapsed() + drift)
                .is_some_and(|v| !v.is_zero());
            if granted.len() - not_raised >= self.quorum && valid {
                let n = granted.len();
                let mut rec = granted.swap_remove(0).1;
                rec.fence = fence;
                rec.store
                    .insert("nodes_granted".into(), format!("{n}/{}", self.nodes.len()));
                return Ok(AcquireOutcome::Granted(rec));
            }
        }
        if !granted.is_empty() {
            // Undo the minority (or too slow) grants everywhere; the script frees only our token.
            let call = self.first().release_call(&req.key, &req.token, false);
            let _ = self.all(|n| n.call::<i64>(&call)).await;
        }
        let answered = granted.len() + held.len();
        if answered < self.quorum {
            return Err(self.too_few(answered, &failed));
        }
        // Report the holder most nodes name (or a split vote, which the waiter retries with jitter).
        let mut counts: BTreeMap<Option<String>, usize> = BTreeMap::new();
        for (_, r) in &held {
            *counts.entry(r.holder.clone()).or_default() += 1;
        }
        let top = counts
            .into_iter()
            .max_by_key(|(_, c)| *c)
            .and_then(|(h, _)| h);
        let mut rec = held
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r.holder == top)
            .max_by_key(|r| r.expires_ms)
            .cloned()
            .unwrap_or_else(|| LeaseRecord::free(req.key.as_str(), 0));
        if rec.holder.is_none() && rec.waiter.is_none() {
            rec.holder = Some("nobody with a majority (split vote)".into());
            rec.token = Some(String::new());
            rec.expires_ms = crate::record::now_ms() + 1;
        }
        if held
            .iter()
            .any(|(_, r)| r.waiter_token.as_deref() == Some(req.token.as_str()))
        {
            rec.waiter_token = Some(req.token.clone());
        }
        Ok(AcquireOutcome::Held(rec))
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        let started = Instant::now();
        let results = self.all(|n| n.renew(key, token, ttl)).await;
        let mut renewed: Vec<LeaseRecord> = vec![];
        let mut lost: Vec<LostReason> = vec![];
        let mut failed: Vec<(&str, Error)> = vec![];
        for (name, r) in results {
            match r {
                Ok(RenewOutcome::Renewed(rec)) => renewed.push(rec),
                Ok(RenewOutcome::Lost(reason)) => lost.push(reason),
                Err(e) => failed.push((name, e)),
            }
        }
        let drift = crate::options::drift(ttl);
        if renewed.len() >= self.quorum && started.elapsed() + drift < ttl {
            let now = crate::record::now_ms();
            let pick = renewed
                .iter()
                .position(|r| r.has_live_waiter(now))
                .unwrap_or(0);
            let fence = renewed.iter().map(|r| r.fence).max().unwrap_or(0);
            let mut rec = renewed.swap_remove(pick);
            rec.fence = fence;
            return Ok(RenewOutcome::Renewed(rec));
        }
        if lost.len() > self.nodes.len() - self.quorum {
            // A majority no longer has it: it cannot come back.
            let reason = lost
                .iter()
                .find(|r| matches!(r, LostReason::TakenOver { .. }))
                .cloned()
                .unwrap_or_else(|| lost[0].clone());
            return Ok(RenewOutcome::Lost(reason));
        }
        Err(self.too_few(renewed.len() + lost.len(), &failed))
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        // Every node answers (or times out) before the release does: a release answered by a
        // majority alone would leave the record on a slower node for a moment, which `inspect`
        // and `list` (the union of the nodes' records) would still show.
        let call = self.first().release_call(key, token, false);
        let answers = self.answers(|n| n.call::<i64>(&call)).await?;
        let released = answers
            .into_iter()
            .any(|a| RedisStore::release_answer(a) == ReleaseOutcome::Released);
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        let _ = self.all(|n| n.withdraw_waiter(key, token)).await;
        Ok(())
    }

    /// On every node that answers (the release goes to each), whichever lease each holds: a
    /// node's fence may be below the majority's, so `fence` is not compared and the answer is
    /// `Ok(true)`.
    async fn notify_release(&self, key: &Key, _fence: Option<u64>) -> Result<bool> {
        self.answers(|n| n.notify_release(key, None)).await?;
        Ok(true)
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        let mut best: Option<Inspection> = None;
        for found in self
            .answers(|n| n.inspect(key))
            .await?
            .into_iter()
            .flatten()
        {
            match found {
                Inspection::Record(rec) => {
                    let better = match &best {
                        Some(Inspection::Record(b)) => rec.fence > b.fence,
                        _ => true,
                    };
                    if better {
                        best = Some(Inspection::Record(rec));
                    }
                }
                corrupt => {
                    best.get_or_insert(corrupt);
                }
            }
        }
        Ok(best)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        let mut by_key: BTreeMap<String, LeaseRecord> = BTreeMap::new();
        let mut corrupt = vec![];
        for found in self
            .answers(|n| n.list(prefix))
            .await?
            .into_iter()
            .flatten()
        {
            match found {
                Inspection::Record(rec) => {
                    let e = by_key.entry(rec.key.clone()).or_insert_with(|| rec.clone());
                    if rec.fence > e.fence {
                        *e = rec;
                    }
                }
                c => corrupt.push(c),
            }
        }
        Ok(by_key
            .into_values()
            .map(Inspection::Record)
            .chain(corrupt)
            .collect())
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        Ok(self
            .answers(|n| n.force_release(key))
            .await?
            .into_iter()
            .flatten()
            .next())
    }

    async fn cleanup(
        &self,
        _older_than: Duration,
        _progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        Ok(CleanupReport::default())
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        let mut watches = vec![];
        for (_, r) in self.all(|n| n.subscribe(key)).await {
            if let Ok(Some(w)) = r {
                watches.push(w);
            }
        }
        Ok(if watches.is_empty() {
            None
        } else {
            Some(Box::new(AnyWatch(watches)))
        })
    }
}

/// PINGs a left-out node (each `PING` bounded by `timeout`, then a pause as long) until it
/// answers in time, then takes it back; ends early when a call took it back, or when the store is
/// dropped.
async fn probe(
    health: Weak<[Health]>,
    i: usize,
    name: String,
    node: RedisStore,
    timeout: Duration,
) {
    loop {
        let answered = matches!(tokio::time::timeout(timeout, node.ping()).await, Ok(Ok(())));
        let Some(all) = health.upgrade() else {
            return;
        };
        let h = &all[i];
        if answered && h.out.swap(false, Ordering::Relaxed) {
            tracing::info!(node = %name, "a Redlock node answers again");
        }
        if !h.out.load(Ordering::Relaxed) {
            h.probing.store(false, Ordering::Relaxed);
            // Left out again meanwhile, by a call that found this probe still under way: go on.
            if !h.out.load(Ordering::Relaxed) || h.probing.swap(true, Ordering::Relaxed) {
                return;
            }
        }
        drop(all);
        tokio::time::sleep(timeout.max(Duration::from_millis(10))).await;
    }
}

/// Wakes when any node's watch wakes.
#[derive(Debug)]
struct AnyWatch(Vec<Box<dyn ChangeWatch>>);

#[async_trait]
impl ChangeWatch for AnyWatch {
    async fn changed(&mut self) {
        let futs = self.0.iter_mut().map(|w| w.changed());
        select_all(futs).await;
    }

    /// Stale once every node's subscription is: one node still heard is enough to wake a waiter.
    fn stale(&self) -> bool {
        self.0.iter().all(|w| w.stale())
    }
}
