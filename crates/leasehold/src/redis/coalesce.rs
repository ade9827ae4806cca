//! Acquire and release calls coalesced into one script call while the server is busy.
//!
//! Each call of a script that has a batched form ([`Batched`]: the acquire and release scripts)
//! goes out at once, as its own call, while fewer than [`IN_FLIGHT`] such calls are waiting for
//! the server. Beyond that it waits in its lane's queue, and the next call to come back sends the
//! whole queue (at most [`MOST`] calls) as one call of the batched script, which runs every
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
//! leaves is left out of it. Not on a cluster, whose script calls must keep to one slot.

use super::{map_err, read_only, shared_error, Conn, Link, Lua, ScriptCall};
use crate::error::{Error, Result};
use ::redis::Value;
use std::sync::Arc;

/// How many calls of one lane may wait for the server before others are coalesced.
pub(super) const IN_FLIGHT: usize = 4;

/// The most operations one batched call carries.
const MOST: usize = 256;

/// The lanes: one per script with a batched form.
pub(super) const LANES: usize = 2;

/// The lane of the acquire script.
pub(super) const ACQUIRE_LANE: usize = 0;

/// The lane of the release script.
pub(super) const RELEASE_LANE: usize = 1;

/// A script's batched form: the same body run for each operation of one call.
pub(super) struct Batched {
    /// The batched script: KEYS are every operation's keys in turn (`keys` each), ARGV every
    /// operation's arguments in turn (`args` each); it answers one value per operation, an error
    /// reply for an operation that raised one.
    pub(super) lua: Lua,
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
    pub(super) fn new(prologue: &str, body: &str, keys: usize, args: usize, lane: usize) -> Self {
        let body = offset(&offset(body, "KEYS", "o"), "ARGV", "p");
        let text = format!(
            r#"{prologue}
local function one(o, p)
{body}
end
local out = {{}}
for i = 0, #KEYS / {keys} - 1 do
  local ok, r = pcall(one, {keys} * i, {args} * i)
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
        );
        Batched {
            lua: Lua::new(text),
            keys,
            args,
            lane,
        }
    }
}

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
pub(super) struct Lane {
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
    let queued = {
        let mut lane = link.lanes[batched.lane].lock();
        if lane.in_flight >= IN_FLIGHT {
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
                store: link.described.clone(),
                detail: "the call was dropped unsent (the runtime is shutting down)".into(),
            }),
            Err(_) => Err(Error::no_answer(link.described.clone())),
        };
    }
    let _turn = Turn {
        link: link.clone(),
        lua: call.lua.clone(),
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
}

impl Drop for Turn {
    fn drop(&mut self) {
        let Some(batched) = self.lua.batched() else {
            return;
        };
        let mut lane = self.link.lanes[batched.lane].lock();
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
            let call = ScriptCall {
                lua: turn.lua.clone(),
                cmd: job.cmd,
            };
            let _ = job.reply.send(alone(link, &call).await);
        }
        return;
    }
    let call = batch_call(batched, &jobs);
    let answer = link
        .send(|mut conn| async move {
            let values = send_batch(&call, &mut conn).await?;
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
                let out = match v {
                    Value::ServerError(e) => Err(map_err(&link.described, e.into())),
                    v => Ok(v),
                };
                let _ = job.reply.send(out);
            }
        }
        Ok(values) => {
            let n = jobs.len();
            for job in jobs {
                let _ = job.reply.send(Err(Error::Store {
                    store: link.described.clone(),
                    detail: format!(
                        "the batched script answered {} values for {} calls",
                        values.len(),
                        n
                    ),
                    retryable: false,
                }));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(shared_error(link, &e)));
            }
        }
    }
}

/// One call of `batched` for `jobs`: their keys in turn, then their arguments in turn (each
/// job's command is `EVALSHA hash numkeys keys… args…`).
fn batch_call(batched: &Batched, jobs: &[Queued]) -> ScriptCall {
    let bytes = jobs
        .iter()
        .flat_map(|j| j.cmd.args_iter().skip(3))
        .map(|a| match a {
            ::redis::Arg::Simple(a) => a.len(),
            _ => 0,
        })
        .sum::<usize>();
    let mut call = batched
        .lua
        .prepare(batched.keys * jobs.len(), batched.args * jobs.len(), bytes);
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
    call
}

/// Sends a batched call and returns its answers, errors among them as values (a command's
/// answer read the usual way turns any error inside it into an error of the whole call).
async fn send_batch(call: &ScriptCall, conn: &mut Conn) -> ::redis::RedisResult<Vec<Value>> {
    match call.send_raw(conn).await? {
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
}
