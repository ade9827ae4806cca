//! Acquire and release calls coalesced into one script call while the server is busy.
//!
//! Each call of a script that has a batched form ([`Batched`]: the acquire, permit acquire and
//! release scripts)
//! goes out at once, as its own call, while fewer than [`IN_FLIGHT`] such calls are waiting for
//! the server (one, for a store that waits for replicas: see `in_flight`). Beyond that it waits
//! in its lane's queue, and the next call to come back sends the whole queue (at most [`MOST`]
//! calls) as one call of the batched script (its text is made in `scripts.rs`), which runs every
//! operation in turn, as separate calls would, and answers each on its own (an error raised by
//! one, such as a fence counter an operator overwrote, is that operation's answer alone). The
//! lanes are the store's ([`Coalescer`]).
//!
//! So a lone caller never waits for a batch (one task pays nothing), and many concurrent callers
//! share the script's fixed cost on the server (parsing, finding and starting the script, the
//! reply) and the connection's per-request cost on the client: with 64 tasks acquiring and
//! releasing, about a quarter more cycles a second (see the book's performance page,
//! `docs/src/performance.md#redis-and-redlock`). A queued call waits for one call of its lane to
//! come back, then takes one round trip; the store's timeout bounds the two together, from the
//! moment the call is made, as it bounds a lone call. An acquisition whose caller has gone before
//! its batch leaves is left out of it.
//!
//! On a Redis Cluster the lanes are per primary (by the store's slot map): a batch goes to one
//! primary as a call of the batched script's node form, which names no keys (declared keys must
//! share one slot) and carries the `allow-cross-slot-keys` flag of Redis 7, like the renewals'.
//! An operation whose key that node does not serve (a failover or resharding since the map was
//! read) is answered `ELSEWHERE` before it runs, and sent again alone, naming its key, which
//! follows the cluster's redirections. While the store has no fresh slot map, calls go alone.

#[cfg(feature = "redis-cluster")]
use super::cluster::{self, ClusterNodes, Node};
use super::conn::Conn;
use super::error::{map_err, read_only, shared_error};
use super::link::Link;
#[cfg(feature = "redis-cluster")]
use super::link::Origin;
#[cfg(feature = "redis-cluster")]
use super::scripts::ELSEWHERE;
use super::scripts::{Batched, Lua, ScriptCall, ACQUIRE_LANE, LANES, PERMIT_LANE};
use crate::error::{Error, Result};
use ::redis::Value;
use parking_lot::Mutex;
#[cfg(feature = "redis-cluster")]
use std::collections::HashMap;
use std::sync::Arc;

/// How many calls of one lane may wait for the server before others are coalesced.
pub(super) const IN_FLIGHT: usize = 4;

/// How many calls of `call`'s lane may wait for the server before others are coalesced:
/// [`IN_FLIGHT`], or one for a script whose calls wait for replicas (each call's `WAIT` holds the
/// connection until the replicas acknowledge, so calls sent one by one would take turns at it,
/// where a batch shares one).
fn in_flight(call: &ScriptCall) -> usize {
    if call.lua.waits_for_replicas() {
        1
    } else {
        IN_FLIGHT
    }
}

/// The most operations one batched call carries.
const MOST: usize = 256;

/// The lanes of one server (or of one cluster primary).
pub(crate) type Lanes = [Mutex<Lane>; LANES];

/// Whether a queued call whose caller has gone (its future dropped before the batch left) is
/// left out of the batch: an acquisition nobody waits for would take a lease nobody holds (until
/// its TTL), while a release is still worth making.
fn leave_out_abandoned(lane: usize) -> bool {
    lane == ACQUIRE_LANE || lane == PERMIT_LANE
}

/// One lane: its calls in flight and those waiting for a batch.
#[derive(Default)]
pub(crate) struct Lane {
    in_flight: usize,
    queue: Vec<Queued>,
}

/// A call waiting in a lane.
struct Queued {
    cmd: ::redis::Cmd,
    reply: tokio::sync::oneshot::Sender<Result<Value>>,
}

/// A store's lanes: the acquire and release calls in flight, and those queued for the next
/// batch, of its one server, or on a cluster of each primary.
#[derive(Default)]
pub(super) struct Coalescer {
    /// The lanes of the one server.
    lanes: Arc<Lanes>,
    /// The lanes of each cluster primary (`host`, `port`).
    #[cfg(feature = "redis-cluster")]
    primaries: Mutex<HashMap<Node, Arc<Lanes>>>,
}

impl Coalescer {
    /// Sends `call` (of a script whose batched form is `batched`) on `link`: at once, or, while
    /// [`IN_FLIGHT`] calls of its lane wait for the server, in the next batch.
    pub(super) async fn send(
        &self,
        link: &Arc<Link>,
        batched: &Batched,
        call: &ScriptCall,
    ) -> Result<Value> {
        send_in(link, self.lanes.clone(), None, batched, call).await
    }

    /// [`Coalescer::send`] on a cluster: in the lanes of the primary serving the call's key, by
    /// the store's slot map; alone (routed by its key) while the map is missing or stale, which
    /// is then read again in the background.
    #[cfg(feature = "redis-cluster")]
    pub(super) async fn send_to_primary(
        &self,
        link: &Arc<Link>,
        nodes: &ClusterNodes,
        batched: &Batched,
        call: &ScriptCall,
    ) -> Result<Value> {
        let slot = call.first_key().map(cluster::slot);
        match slot.and_then(|slot| Some((slot, self.lanes_for(nodes, slot)?))) {
            Some((slot, lanes)) => send_in(link, lanes, Some(slot), batched, call).await,
            None => {
                if nodes.claim_map_read() {
                    // The claim ends with the read, or with the task dropped unrun (a runtime
                    // shutting down): one background read at a time, never none for good.
                    let claim = MapReadClaim(link.clone());
                    tokio::spawn(async move {
                        let link = &claim.0;
                        if let Origin::Cluster(nodes) = &link.origin {
                            let conn = link.current.lock().1.clone();
                            nodes.read_map(&conn, &link.described, link.timeout).await;
                        }
                    });
                }
                alone(link, call).await
            }
        }
    }

    /// The lanes of the primary serving `slot` by a fresh slot map of `nodes`, or `None`.
    #[cfg(feature = "redis-cluster")]
    fn lanes_for(&self, nodes: &ClusterNodes, slot: u16) -> Option<Arc<Lanes>> {
        nodes.with_primary(slot, |node| {
            let mut lanes = self.primaries.lock();
            if let Some(l) = lanes.get(node) {
                return l.clone();
            }
            lanes.entry(node.clone()).or_default().clone()
        })
    }
}

/// A background read of a cluster's slot map under way ([`Coalescer::send_to_primary`]);
/// dropped, it ends the claim.
#[cfg(feature = "redis-cluster")]
struct MapReadClaim(Arc<Link>);

#[cfg(feature = "redis-cluster")]
impl Drop for MapReadClaim {
    fn drop(&mut self) {
        if let Origin::Cluster(nodes) = &self.0.origin {
            nodes.end_map_read();
        }
    }
}

/// [`Coalescer::send`] in `lanes`: those of the one server (`slot` None), or those of the cluster primary
/// serving `slot`.
async fn send_in(
    link: &Arc<Link>,
    lanes: Arc<Lanes>,
    slot: Option<u16>,
    batched: &Batched,
    call: &ScriptCall,
) -> Result<Value> {
    let queued = {
        let mut lane = lanes[batched.lane].lock();
        if lane.in_flight >= in_flight(call) {
            let (reply, answer) = tokio::sync::oneshot::channel();
            lane.queue.push(Queued {
                cmd: call.cmd.clone(),
                reply,
            });
            Some(answer)
        } else {
            lane.in_flight += 1;
            None
        }
    };
    if let Some(answer) = queued {
        // The store's timeout bounds the whole wait, from now, as it bounds a lone call. A call
        // still queued when its caller gives up is left out of its batch if it acquires.
        return match tokio::time::timeout(link.timeout, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Error::Unavailable {
                source: None,
                store: link.described.clone(),
                detail: "the call was dropped unsent (the runtime is shutting down)".into(),
            }),
            Err(_) => Err(Error::no_answer(link.described.clone())),
        };
    }
    let _turn = Turn {
        link: link.clone(),
        lua: call.lua.clone(),
        lanes,
        slot,
    };
    alone(link, call).await
}

/// Sends `call` as its own call.
async fn alone(link: &Arc<Link>, call: &ScriptCall) -> Result<Value> {
    link.send(|mut conn| async move { call.send::<Value>(&mut conn).await })
        .await
}

/// A call of a lane in flight. When it ends (answered, failed or dropped), the lane's queue goes
/// out as the next batch, which takes over its place; with nothing queued the place is freed.
struct Turn {
    link: Arc<Link>,
    /// The single-operation script (its batched form names the lane).
    lua: Lua,
    /// The lanes it is in.
    lanes: Arc<Lanes>,
    /// On a cluster, a slot the lanes' primary serves (a batch is routed by it).
    slot: Option<u16>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(batched) = self.lua.batched() else {
            return;
        };
        let mut lane = self.lanes[batched.lane].lock();
        if lane.queue.is_empty() {
            lane.in_flight -= 1;
            return;
        }
        let n = lane.queue.len().min(MOST);
        let jobs: Vec<Queued> = lane.queue.drain(..n).collect();
        drop(lane);
        let next = Turn {
            link: self.link.clone(),
            lua: self.lua.clone(),
            lanes: self.lanes.clone(),
            slot: self.slot,
        };
        // Outside a runtime (it is shutting down) the jobs are dropped, and their callers told;
        // `next` then frees the place or takes the rest of the queue the same way.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(run(next, jobs));
        }
    }
}

/// Sends `jobs` as one call (the single-operation script for one job, the batched one for more)
/// and answers each.
async fn run(turn: Turn, mut jobs: Vec<Queued>) {
    let link = &turn.link;
    let Some(batched) = turn.lua.batched() else {
        return;
    };
    if leave_out_abandoned(batched.lane) {
        jobs.retain(|j| !j.reply.is_closed());
    }
    if jobs.len() <= 1 {
        if let Some(job) = jobs.pop() {
            answer_alone(&turn, job).await;
        }
        return;
    }
    #[cfg(feature = "redis-cluster")]
    if let Some(slot) = turn.slot {
        return run_on_primary(&turn, batched, slot, jobs).await;
    }
    let call = &batch_call(batched, &jobs);
    let answer = link
        .send(|mut conn| async move {
            let values = send_batch(call, &mut conn).await?;
            // A demoted server refuses every write: the whole call fails, so that the link
            // connects again (`Link::send`).
            if let Some(e) = values.iter().find_map(|v| match v {
                Value::ServerError(e) => {
                    Some(::redis::RedisError::from(e.clone())).filter(read_only)
                }
                _ => None,
            }) {
                return Err(e);
            }
            Ok(values)
        })
        .await;
    match answer {
        Ok(values) if values.len() == jobs.len() => {
            for (job, v) in jobs.into_iter().zip(values) {
                answer_value(link, job, v);
            }
        }
        Ok(values) => {
            let n = jobs.len();
            fail_all(jobs, || mismatch(link, values.len(), n));
        }
        Err(e) => fail_all(jobs, || shared_error(&link.described, &e)),
    }
}

/// Sends `jobs` to the cluster primary serving `slot` as one call of the batched script's node
/// form, and answers each; those the node does not serve (answered `ELSEWHERE`), and all of them
/// when the node refuses the call itself, go again alone, naming their keys.
#[cfg(feature = "redis-cluster")]
async fn run_on_primary(turn: &Turn, batched: &Batched, slot: u16, jobs: Vec<Queued>) {
    use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    let link = &turn.link;
    let n = jobs.len();
    let mut call = batched
        .node
        .prepare(0, (batched.keys + batched.args) * n, batch_bytes(&jobs));
    push_jobs(&mut call, batched, &jobs);
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot,
        SlotAddr::Master,
    )));
    let (call, route) = (&call, &route);
    let answer = link
        .send(|conn| async move { answers(call.send_routed_raw(conn, route.clone()).await?) })
        .await;
    let mut again = vec![];
    match answer {
        Ok(values) if values.len() == jobs.len() => {
            for (job, v) in jobs.into_iter().zip(values) {
                match v {
                    Value::ServerError(e) if e.code() == ELSEWHERE => again.push(job),
                    v => answer_value(link, job, v),
                }
            }
            if !again.is_empty() {
                // Found out of date (a failover, a resharding): read again.
                if let Origin::Cluster(nodes) = &link.origin {
                    nodes.forget_map();
                }
            }
        }
        Err(e @ Error::Unavailable { .. }) => fail_all(jobs, || shared_error(&link.described, &e)),
        // It ran, but its answer does not match: the operations may have run, so none is sent
        // again.
        Ok(values) => {
            let n = jobs.len();
            fail_all(jobs, || mismatch(link, values.len(), n));
        }
        // The node refused the call itself, before running it (a script flag it does not know,
        // out of memory, busy): each goes alone, as it would have without coalescing.
        Err(e) => {
            tracing::debug!(store = %link.described, error = %e, "a node refused a batched call; sending its calls alone");
            again = jobs;
        }
    }
    futures_util::future::join_all(again.into_iter().map(|job| answer_alone(turn, job))).await;
}

/// Sends `job` as its own call of the single-operation script, and answers it.
async fn answer_alone(turn: &Turn, job: Queued) {
    let call = ScriptCall {
        lua: turn.lua.clone(),
        cmd: job.cmd,
    };
    let _ = job.reply.send(alone(&turn.link, &call).await);
}

/// Answers `job` with its operation's value in a batch's answer (an error reply is its error).
fn answer_value(link: &Link, job: Queued, v: Value) {
    let out = match v {
        Value::ServerError(e) => Err(map_err(&link.described, e.into())),
        v => Ok(v),
    };
    let _ = job.reply.send(out);
}

/// Answers each of `jobs` with the error `err` makes.
fn fail_all(jobs: Vec<Queued>, err: impl Fn() -> Error) {
    for job in jobs {
        let _ = job.reply.send(Err(err()));
    }
}

/// The error of each call of a batch whose script answered `got` values for `calls` calls.
fn mismatch(link: &Link, got: usize, calls: usize) -> Error {
    Error::Store {
        source: None,
        store: link.described.clone(),
        detail: format!("the batched script answered {got} values for {calls} calls"),
        retryable: false,
    }
}

/// One call of `batched` for `jobs`: their keys in turn, then their arguments in turn (each
/// job's command is `EVALSHA hash numkeys keys… args…`).
fn batch_call(batched: &Batched, jobs: &[Queued]) -> ScriptCall {
    let mut call = batched.lua.prepare(
        batched.keys * jobs.len(),
        batched.args * jobs.len(),
        batch_bytes(jobs),
    );
    push_jobs(&mut call, batched, jobs);
    call
}

/// The size of `jobs`' keys and arguments, to size a batch's buffer once.
fn batch_bytes(jobs: &[Queued]) -> usize {
    jobs.iter()
        .flat_map(|j| j.cmd.args_iter().skip(3))
        .map(|a| match a {
            ::redis::Arg::Simple(a) => a.len(),
            _ => 0,
        })
        .sum()
}

/// Appends `jobs`' keys in turn, then their arguments in turn, to `call`.
fn push_jobs(call: &mut ScriptCall, batched: &Batched, jobs: &[Queued]) {
    for j in jobs {
        for a in j.cmd.args_iter().skip(3).take(batched.keys) {
            if let ::redis::Arg::Simple(a) = a {
                call.arg(a);
            }
        }
    }
    for j in jobs {
        for a in j.cmd.args_iter().skip(3 + batched.keys) {
            if let ::redis::Arg::Simple(a) = a {
                call.arg(a);
            }
        }
    }
}

/// Sends a batched call and returns its answers, errors among them as values (a command's
/// answer read the usual way turns any error inside it into an error of the whole call).
async fn send_batch(call: &ScriptCall, conn: &mut Conn) -> ::redis::RedisResult<Vec<Value>> {
    answers(call.send_raw(conn).await?)
}

/// A batched script's answer: one value per operation.
fn answers(answer: Value) -> ::redis::RedisResult<Vec<Value>> {
    match answer {
        Value::Array(values) => Ok(values),
        other => Err((
            ::redis::ErrorKind::Client,
            "the batched script answered no list",
            format!("{other:?}"),
        )
            .into()),
    }
}
