//! Acquire and release calls coalesced into one script call while the server is busy.
//!
//! Each call of a script that has a batched form ([`Batched`]: the acquire and release scripts)
//! goes out at once, as its own call, while fewer than [`IN_FLIGHT`] such calls are waiting for
//! the server (one, for a store that waits for replicas: see `in_flight`). Beyond that it waits
//! in its lane's queue, and the next call to come back sends the whole queue (at most [`MOST`]
//! calls) as one call of the batched script, which runs every
//! operation in turn, as separate calls would, and answers each on its own (an error raised by
//! one, such as a fence counter an operator overwrote, is that operation's answer alone).
//!
//! So a lone caller never waits for a batch (one task pays nothing), and many concurrent callers
//! share the script's fixed cost on the server (parsing, finding and starting the script, the
//! reply) and the connection's per-request cost on the client: with 64 tasks acquiring and
//! releasing, about a quarter more cycles a second (see the README's performance section). A
//! queued call waits for one call of its lane to come back, then takes one round trip; the
//! store's timeout bounds the two together, from the moment the call is made, as it bounds a
//! lone call. An acquisition whose caller has gone before its batch
//! leaves is left out of it.
//!
//! On a Redis Cluster the lanes are per primary (by the store's slot map): a batch goes to one
//! primary as a call of the batched script's node form, which names no keys (declared keys must
//! share one slot) and carries the `allow-cross-slot-keys` flag of Redis 7, like the renewals'.
//! An operation whose key that node does not serve (a failover or resharding since the map was
//! read) is answered `ELSEWHERE` before it runs, and sent again alone, naming its key, which
//! follows the cluster's redirections. While the store has no fresh slot map, calls go alone.

use super::{map_err, read_only, shared_error, Conn, Link, Lua, ScriptCall};
use crate::error::{Error, Result};
use ::redis::Value;
use parking_lot::Mutex;
use std::sync::Arc;

/// How many calls of one lane may wait for the server before others are coalesced.
pub(super) const IN_FLIGHT: usize = 4;

/// How many calls of `call`'s lane may wait for the server before others are coalesced:
/// [`IN_FLIGHT`], or one for a script whose calls wait for replicas (each call's `WAIT` holds the
/// connection until the replicas acknowledge, so calls sent one by one would take turns at it,
/// where a batch shares one).
fn in_flight(call: &ScriptCall) -> usize {
    if call.lua.0.wait.is_some() {
        1
    } else {
        IN_FLIGHT
    }
}

/// The most operations one batched call carries.
const MOST: usize = 256;

/// The lanes: one per script with a batched form.
pub(super) const LANES: usize = 2;

/// The lane of the acquire script.
pub(super) const ACQUIRE_LANE: usize = 0;

/// The lane of the release script.
pub(super) const RELEASE_LANE: usize = 1;

/// The lanes of one server (or of one cluster primary).
pub(crate) type Lanes = [Mutex<Lane>; LANES];

/// The code of the error a node-form batch answers for an operation whose key the node does not
/// serve.
#[cfg(feature = "redis-cluster")]
const ELSEWHERE: &str = "ELSEWHERE";

/// A script's batched form: the same body run for each operation of one call.
pub(super) struct Batched {
    /// The batched script: KEYS are every operation's keys in turn (`keys` each), ARGV every
    /// operation's arguments in turn (`args` each); it answers one value per operation, an error
    /// reply for an operation that raised one.
    pub(super) lua: Lua,
    /// The form for one cluster primary: every operation's keys, then every operation's
    /// arguments, all as arguments; it answers `ELSEWHERE …` for an operation whose key the node
    /// does not serve, without running it.
    #[cfg(feature = "redis-cluster")]
    node: Lua,
    keys: usize,
    args: usize,
    lane: usize,
}

/// Whether a queued call whose caller has gone (its future dropped before the batch left) is
/// left out of the batch: an acquisition nobody waits for would take a lease nobody holds (until
/// its TTL), while a release is still worth making.
fn leave_out_abandoned(lane: usize) -> bool {
    lane == ACQUIRE_LANE
}

impl Batched {
    /// The batched form of `prologue` then `body` (a script that takes `keys` keys and `args`
    /// arguments, and returns a value on every path), queued in `lane`. The prologue runs once
    /// per call; the body once per operation, as a function whose keys and arguments are those
    /// of its operation (`KEYS[n]` in the body reads `KEYS[o + n]`, `o` the operation's offset:
    /// no table per operation).
    pub(super) fn new(
        prologue: &str,
        body: &str,
        keys: usize,
        args: usize,
        lane: usize,
        wait: Option<super::Wait>,
    ) -> Self {
        let body = offset(&offset(body, "KEYS", "o"), "ARGV", "p");
        let one_call = batch_text(
            "",
            prologue,
            &body,
            "local function run(o, p) return pcall(one, o, p) end",
            &format!("local n = #KEYS / {keys}"),
            &format!("{keys} * i, {args} * i"),
        );
        Batched {
            lua: Lua::waiting(one_call, wait),
            #[cfg(feature = "redis-cluster")]
            node: Lua::waiting(node_text(prologue, &body, keys, args), wait),
            keys,
            args,
            lane,
        }
    }
}

/// A batched script: `flags` (a first line of flags, or nothing), `prologue`, the operation's
/// `body` as the function `one(o, p, pre)` (`pre`: what the runner read for it, if anything),
/// then `runner` (which defines `run(o, p)`, running `one` in `pcall`), and a loop over the `n`
/// operations (`count` sets `n`) that runs each with its offsets (`offsets`: the expressions of
/// `o` and `p` for operation `i`) and answers one value per operation, an error reply for one
/// that raised.
fn batch_text(
    flags: &str,
    prologue: &str,
    body: &str,
    runner: &str,
    count: &str,
    offsets: &str,
) -> String {
    format!(
        r#"{flags}{prologue}
local function one(o, p, pre)
{body}
end
{runner}
{count}
local out = {{}}
for i = 0, n - 1 do
  local o, p = {offsets}
  local ok, r = run(o, p)
  if not ok then
    -- `redis.call` raises its error reply as a table; a Lua error is a string.
    if type(r) == 'table' and r.err then r = {{err = r.err}} else r = {{err = 'ERR ' .. tostring(r)}} end
  elseif r == nil then
    r = false
  end
  out[i + 1] = r
end
return out
"#
    )
}

/// The node form of a batched script ([`Batched::node`]) whose per-operation `body` reads
/// `KEYS[o + n]` and `ARGV[p + n]`.
///
/// Before running an operation it reads its first key: a key of a slot the node does not serve
/// cannot be read there (an error other than `WRONGTYPE`), and the operation is answered
/// `ELSEWHERE` without running. When the body's first read is that same `GET` (the acquire and
/// release scripts'), the body takes the value read (`pre`) instead of reading it again.
#[cfg(feature = "redis-cluster")]
fn node_text(prologue: &str, body: &str, keys: usize, args: usize) -> String {
    // The keys come as arguments, ahead of all operations' arguments.
    let body = body.replace("KEYS[o + ", "ARGV[o + ");
    let (body, probe) = match body.find(FIRST_READ) {
        Some(at) => (
            format!("{}pre{}", &body[..at], &body[at + FIRST_READ.len()..]),
            FIRST_READ,
        ),
        None => (body, "redis.pcall('EXISTS', ARGV[o + 1])"),
    };
    let runner = format!(
        r#"-- A key of a slot this node does not serve cannot be read here: left to a call naming it.
local function run(o, p)
  local pre = {probe}
  if type(pre) == 'table' and not string.find(tostring(pre.err), 'WRONGTYPE', 1, true) then
    return true, {{err = '{ELSEWHERE} ' .. tostring(pre.err)}}
  end
  return pcall(one, o, p, pre)
end"#
    );
    batch_text(
        "#!lua flags=allow-cross-slot-keys\n",
        prologue,
        &body,
        &runner,
        &format!("local n = #ARGV / {}", keys + args),
        &format!("{keys} * i, {keys} * n + {args} * i"),
    )
}

/// An operation's read of its record as the node form's runner makes it, before the operation
/// runs (see [`node_text`]).
#[cfg(feature = "redis-cluster")]
const FIRST_READ: &str = "redis.pcall('GET', ARGV[o + 1])";

/// `body` with every `NAME[n]` (`n` digits) read as `NAME[var + n]`.
fn offset(body: &str, name: &str, var: &str) -> String {
    let open = format!("{name}[");
    let mut out = String::with_capacity(body.len() + body.len() / 8);
    let mut rest = body;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at + open.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at + open.len()]);
        if digits > 0 && after[digits..].starts_with(']') {
            out.push_str(var);
            out.push_str(" + ");
        }
        rest = after;
    }
    out.push_str(rest);
    out
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

/// Sends `call` (of a script whose batched form is `batched`) on `link`: at once, or, while
/// [`IN_FLIGHT`] calls of its lane wait for the server, in the next batch.
pub(super) async fn send(link: &Arc<Link>, batched: &Batched, call: &ScriptCall) -> Result<Value> {
    send_in(link, link.lanes.clone(), None, batched, call).await
}

/// [`send`] on a cluster: in the lanes of the primary serving the call's key, by the store's
/// slot map; alone (routed by its key) while the map is missing or stale, which is then read
/// again in the background.
#[cfg(feature = "redis-cluster")]
pub(super) async fn send_to_primary(
    link: &Arc<Link>,
    nodes: &crate::stores::redis::cluster::ClusterNodes,
    batched: &Batched,
    call: &ScriptCall,
) -> Result<Value> {
    let slot = call.first_key().map(crate::stores::redis::cluster::slot);
    match slot.and_then(|slot| Some((slot, nodes.lanes_for(slot)?))) {
        Some((slot, lanes)) => send_in(link, lanes, Some(slot), batched, call).await,
        None => {
            if nodes.claim_map_read() {
                // The claim ends with the read, or with the task dropped unrun (a runtime
                // shutting down): one background read at a time, never none for good.
                let claim = MapReadClaim(link.clone());
                tokio::spawn(async move {
                    let link = &claim.0;
                    if let super::Origin::Cluster(nodes) = &link.origin {
                        let conn = link.current.lock().1.clone();
                        nodes.read_map(&conn, &link.described, link.timeout).await;
                    }
                });
            }
            alone(link, call).await
        }
    }
}

/// A background read of a cluster's slot map under way ([`send_to_primary`]); dropped, it ends
/// the claim.
#[cfg(feature = "redis-cluster")]
struct MapReadClaim(Arc<Link>);

#[cfg(feature = "redis-cluster")]
impl Drop for MapReadClaim {
    fn drop(&mut self) {
        if let super::Origin::Cluster(nodes) = &self.0.origin {
            nodes.end_map_read();
        }
    }
}

/// [`send`] in `lanes`: those of the one server (`slot` None), or those of the cluster primary
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
        Err(e) => fail_all(jobs, || shared_error(link, &e)),
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
                if let super::Origin::Cluster(nodes) = &link.origin {
                    nodes.forget_map();
                }
            }
        }
        Err(e @ Error::Unavailable { .. }) => fail_all(jobs, || shared_error(link, &e)),
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

#[cfg(test)]
mod tests {
    use super::offset;

    #[test]
    fn offsets_apply_to_indexed_reads_only() {
        assert_eq!(
            offset(
                "redis.call('GET', KEYS[1]) .. KEYS[12] .. KEYS[o] .. #KEYS .. KEYS[",
                "KEYS",
                "o"
            ),
            "redis.call('GET', KEYS[o + 1]) .. KEYS[o + 12] .. KEYS[o] .. #KEYS .. KEYS["
        );
        assert_eq!(
            offset("ARGV[2]ARGV[3]", "ARGV", "p"),
            "ARGV[p + 2]ARGV[p + 3]"
        );
    }

    /// The acquire and release scripts' node forms read each operation's record once: the
    /// runner's read, which tells a key served elsewhere, is the one the body uses.
    #[cfg(feature = "redis-cluster")]
    #[test]
    fn node_forms_read_each_record_once() {
        let scripts = super::super::Scripts::new(None);
        for lua in [&scripts.acquire, &scripts.release] {
            let node = lua.batched().map_or("", |b| b.node.0.body.as_str());
            assert_eq!(node.matches("redis.pcall('GET'").count(), 1, "{node}");
            assert_eq!(node.matches(super::FIRST_READ).count(), 1, "{node}");
            assert!(!node.contains("EXISTS"), "{node}");
            assert!(node.contains("local raw = pre\n"), "{node}");
        }
    }
}
