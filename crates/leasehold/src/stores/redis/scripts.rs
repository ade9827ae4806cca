//! The store's Lua scripts, and how a call of one is made and sent.
//!
//! Each script is pieces of Lua joined (their text in `lua/*.lua`): [`PRELUDE`]'s helpers, then
//! its body, some with a fast path before the prelude. A file holds its piece from its first
//! line; the `"\n"` put before most of them here keeps the joined scripts, and so their SHA-1s,
//! byte for byte as they were when the pieces were Rust strings.
//!
//! A call ([`ScriptCall`]) is `EVALSHA`, sent again as `EVAL` with the script's body on
//! `NOSCRIPT`; for a store that asks for replicas, followed by `WAIT` in the same round trip.
//! The acquire, permit acquire and release scripts also have a batched form ([`Batched`]) that
//! runs many calls as one, which [`coalesce`](super::coalesce) sends while the server is busy.

use super::conn::Conn;
use super::error::NOT_REPLICATED;
use super::options::Wait;
use std::sync::Arc;

/// The coalescing lanes ([`coalesce`](super::coalesce)): one per script with a batched form.
pub(super) const LANES: usize = 3;

/// The lane of the acquire script.
pub(super) const ACQUIRE_LANE: usize = 0;

/// The lane of the release script.
pub(super) const RELEASE_LANE: usize = 1;

/// The lane of the permit acquire script.
pub(super) const PERMIT_LANE: usize = 2;

/// Shared Lua helpers: server time, record decoding, waiter liveness.
const PRELUDE: &str = concat!("\n", include_str!("lua/prelude.lua"));

/// Comes before the acquire script's body ([`ACQUIRE_FREE`]), and before the whole of its batched
/// form, so that a batch reads the server's time once: `server_ms()`, the server's time in
/// milliseconds as a string, read at its first use in the call, from TIME's seconds and
/// microseconds strings (the microseconds' first digits, zero-padded to three): no number
/// conversion. The operations of one batch run together (nothing else runs on the server
/// meanwhile), so they share one time; later ones' leases then end a little earlier by the
/// record's times, never later (the key's TTL is counted by the server from its `SET`).
const SERVER_MS: &str = concat!("\n", include_str!("lua/server_ms.lua"));

/// The acquire script's fast path, run after [`SERVER_MS`] and before the [`PRELUDE`] (whose
/// helpers it does not need): a key free and never waited for.
///
/// KEYS: record, fence counter. ARGV: the record up to its fence (`{"key":…,"holder":…,
/// "token":…,"fence":`), the record after its times (`,"ttl_ms":…,"waiter":null,…,"labels":…}`),
/// ttl_ms, the number of fences to reserve, waiter_ttl_ms (0: none; negative: register only where
/// nobody else waits, never in line), then 1 if the caller waits
/// for change notifications (subscribed), else 0. The client builds both parts, so the server
/// only adds the fence and its times, and the call carries six arguments.
///
/// Returns `"<fence> <now>"` when it granted a key that was free (the record is then exactly what
/// the caller sent, with that fence and time), else {1, record} granted, {0, record or ''} held,
/// {2, …} another client's value, or {3, kind, permit count} for a semaphore or read-write key
/// with a holder or a waiter (see [`ACQUIRE`]).
const ACQUIRE_FREE: &str = concat!("\n", include_str!("lua/acquire_free.lua"));

/// The rest of the acquire script (after [`ACQUIRE_FREE`] and the [`PRELUDE`]): a record exists.
/// Waiters stand in line (the record's `queue`, as on the record stores): a held key, or a free
/// one reserved for another waiter, gets the caller as its registered waiter if nobody is
/// (`waiter_ttl_ms` ≠ 0), else a place at the end of the line (`waiter_ttl_ms` > 0, at most 63
/// places); a caller without a place that is subscribed marks the record `"watched":true` so that
/// its release publishes. A grant to the registered waiter makes the first queued one the
/// registered waiter; lapsed places are dropped by every write. A semaphore or read-write key
/// refuses the lock while it has a holder or a waiter, and is a lock again (keeping its fence)
/// once it has neither.
const ACQUIRE: &str = concat!("\n", include_str!("lua/acquire.lua"));

/// The permit acquire script, after the [`PRELUDE`]: a permit of a semaphore or a read-write lock
/// (the rules of `decide/permits.rs`, kept here for the server's clock and counter).
///
/// KEYS: record, fence counter. ARGV: the key as the user wrote it; the permit asked for as JSON
/// (holder, token, write, ttl_ms, pid, host, labels: the script adds its fence and times); the
/// kind of key asked for (`semaphore` or `read-write`); the semaphore's permit count (0 for a
/// read-write lock); waiter_ttl_ms (0: none); 1 if the caller waits for change notifications,
/// else 0.
///
/// Returns {1, record} granted (its permit among the holders), {0, record} held (the record
/// with its lapsed holders and places dropped), {2, …} another client's value (as the acquire
/// script), or {3, kind, permit count} when the key is of another kind (`lock`, `semaphore`,
/// `read-write`) and has a holder or a waiter. A grant takes the next fence of the key's
/// counter, as a lock's grant does; a waiter stands in the key's line, as a lock's does.
const ACQUIRE_PERMIT: &str = concat!("\n", include_str!("lua/acquire_permit.lua"));

/// The renewal script's arguments on one server and on a cluster's slot: KEYS: records. ARGV:
/// token, ttl_ms, token as a JSON string per key.
const RENEW_KEYS: &str = include_str!("lua/renew_keys.lua");

/// The renewal script's arguments on a cluster's node, for records in any of the slots it serves
/// (the keys are not declared, since declared keys must share one slot): ARGV: the number of
/// records n, n records, then token, ttl_ms, token as a JSON string per record. A record whose
/// slot the node does not serve (a failover, a resharding: the call finds it moved or moving
/// away) is answered `elsewhere`, and renewed by a call naming its key, which follows the
/// cluster's redirections. The flag lets one call touch keys of several slots.
#[cfg(feature = "redis-cluster")]
const RENEW_NODE_ARGS: &str = include_str!("lua/renew_node_args.lua");

/// The renewal script, after its arguments ([`RENEW_KEYS`], [`RENEW_NODE_ARGS`]) and the
/// [`PRELUDE`]. Returns three values per record: 1, record, '' | 0, 'released'|'expired'|'taken',
/// holder | 0, 'elsewhere', the server's error. One call renews a whole batch. A lock's record
/// nobody waits for is renewed by rewriting its times in place, without decoding it; a permit is
/// renewed in its key's permit table (the record answered is the whole record: the client shows
/// the permit in its lock fields).
const RENEW: &str = concat!("\n", include_str!("lua/renew.lua"));

/// The release script's fast path, run before the [`PRELUDE`]: our record with no registered
/// waiter has a key TTL equal to the lease's, so its key existing means the lease is live. It
/// publishes only when a subscribed contender marked the record `"watched":true`.
///
/// KEYS: record, fence counter. ARGV: token, token as a JSON string, '1' when the release grants
/// the lease to the first in line (see [`RELEASE`]). Returns 1 released, 0 not ours (2: ours but
/// already expired).
const RELEASE_OURS: &str = concat!("\n", include_str!("lua/release_ours.lua"));

/// The rest of the release script (after [`RELEASE_OURS`] and the [`PRELUDE`]). A lock's release
/// is the grant (when asked): the live registered waiter becomes the holder, unclaimed, with the
/// next fence, for what is left of its place, and the release publishes `granted:<its token>`,
/// which wakes that waiter alone; with nobody in line it publishes `released`, which wakes every
/// subscriber. A lock's release always publishes here; a permit's (it alone leaves its key's permit table) publishes when
/// somebody waits in line or a subscribed contender marked the record `"watched":true`.
const RELEASE: &str = concat!("\n", include_str!("lua/release.lua"));

/// KEYS: record, fence counter. ARGV: token. A lease a release granted the token and it has not
/// claimed is released (granted to the next in line, as [`RELEASE`] does). Otherwise takes the
/// token out of the line (and out of a read-write key's waiting writers); publishes when it was the first in line (the next may now take a free
/// lease), and on a semaphore or read-write key wherever it stood (those behind it may now have
/// room).
const WITHDRAW: &str = concat!("\n", include_str!("lua/withdraw.lua"));

/// KEYS: record. ARGV: the fence of the lease to mark, or '' for whichever is held. Marks a held
/// record `"watched":true`, so that its release publishes, keeping everything else (the record's
/// text and the key's TTL). Returns 0 when asked for a fence and the key holds no lease with it
/// (no record, another fence), else 1: marked now or before, or nothing to mark (an unreadable
/// record, one that is free by the server's clock but not yet taken). On a semaphore or
/// read-write key the fence is the last one the key issued, and the record is marked while a
/// permit is held.
const MARK_WATCHED: &str = concat!("\n", include_str!("lua/mark_watched.lua"));

/// KEYS: record. Frees the lease, or every permit of a semaphore or read-write key. Returns the
/// record as it was (or false; a value of another type is false too).
const FORCE: &str = concat!("\n", include_str!("lua/force.lua"));

/// KEYS: record. ARGV: a holder id or an owner token. Frees what it holds: the lease, or its
/// permits. Returns the record as it was when something was freed, else false.
const FORCE_HOLDER: &str = concat!("\n", include_str!("lua/force_holder.lua"));

#[cfg(feature = "redlock")]
/// Raises a fence counter to at least `ARGV[1]` (never lowers it); used by Redlock so that every
/// granting node's counter reaches the fence the majority granted.
const RAISE_FENCE: &str = concat!("\n", include_str!("lua/raise_fence.lua"));

/// A Lua script called with `EVALSHA`; called again with `EVAL` and its body when the server
/// answers `NOSCRIPT` (after a restart, a failover to a replica or `SCRIPT FLUSH`), which runs
/// it and keeps it for the next `EVALSHA`.
///
/// Calls are built straight into a [`::redis::Cmd`] (one buffer), not through
/// [`::redis::ScriptInvocation`], which copies every argument once more. Every call holds its
/// script ([`ScriptCall`]), so the hash and body share one `Arc`.
#[derive(Clone)]
pub(crate) struct Lua(Arc<LuaText>);

/// A script's text and its SHA-1.
struct LuaText {
    hash: String,
    body: String,
    /// The form that runs many calls of it in one ([`Batched`]), for the acquire and release
    /// scripts.
    batched: Option<Batched>,
    /// The replicas each call's writes must reach
    /// ([`RedisOptions::replicas`](super::RedisOptions::replicas)), for the acquire and renewal
    /// scripts of a store that asks for them.
    wait: Option<Wait>,
}

impl Lua {
    fn new(body: String) -> Self {
        Self::waiting(body, None)
    }

    /// A script whose calls wait for `wait`'s replicas ([`ScriptCall::send_raw`]).
    fn waiting(body: String, wait: Option<Wait>) -> Self {
        let hash = ::redis::Script::new(&body).get_hash().to_owned();
        Lua(Arc::new(LuaText {
            hash,
            body,
            batched: None,
            wait,
        }))
    }

    /// A script (`prologue`, then `body`) taking `keys` keys and `args` arguments whose calls are
    /// coalesced in `lane` while the server is busy ([`coalesce`](super::coalesce)), and wait for
    /// `wait`'s replicas, alone or batched.
    fn coalesced(
        prologue: &str,
        body: String,
        (keys, args): (usize, usize),
        lane: usize,
        wait: Option<Wait>,
    ) -> Self {
        let batched = Batched::new(prologue, &body, keys, args, lane, wait);
        let body = format!("{prologue}{body}");
        let hash = ::redis::Script::new(&body).get_hash().to_owned();
        Lua(Arc::new(LuaText {
            hash,
            body,
            batched: Some(batched),
            wait,
        }))
    }

    /// The batched form of this script, if it has one.
    pub(super) fn batched(&self) -> Option<&Batched> {
        self.0.batched.as_ref()
    }

    /// Whether this script's calls wait for replicas
    /// ([`RedisOptions::replicas`](super::RedisOptions::replicas)).
    pub(super) fn waits_for_replicas(&self) -> bool {
        self.0.wait.is_some()
    }

    /// A call of this script taking `keys` keys; the caller appends the keys, then the arguments
    /// (`args` of them, about `bytes` long in all: the command's buffers are sized once, since
    /// growing them costs more than the rest of building the call).
    pub(super) fn prepare(&self, keys: usize, args: usize, bytes: usize) -> ScriptCall {
        let mut cmd = ::redis::Cmd::with_capacity(3 + keys + args, 64 + bytes);
        cmd.arg("EVALSHA").arg(&self.0.hash).arg(keys);
        ScriptCall {
            lua: self.clone(),
            cmd,
        }
    }
}

/// One call of a [`Lua`] script: its `EVALSHA` command (arguments appended through `Deref` to
/// [`::redis::Cmd`]) with the script it calls, so a `NOSCRIPT` answer reloads the right one.
pub(crate) struct ScriptCall {
    pub(super) lua: Lua,
    pub(super) cmd: ::redis::Cmd,
}

impl std::ops::Deref for ScriptCall {
    type Target = ::redis::Cmd;
    fn deref(&self) -> &::redis::Cmd {
        &self.cmd
    }
}

impl std::ops::DerefMut for ScriptCall {
    fn deref_mut(&mut self) -> &mut ::redis::Cmd {
        &mut self.cmd
    }
}

impl ScriptCall {
    /// Sends the call; on `NOSCRIPT` sends it again as `EVAL` with the script.
    pub(super) async fn send<T: ::redis::FromRedisValue>(
        &self,
        conn: &mut Conn,
    ) -> ::redis::RedisResult<T> {
        Ok(::redis::from_redis_value(
            self.send_raw(conn).await?.extract_error()?,
        )?)
    }

    /// [`ScriptCall::send`], answering the value as it came: an error reply to the call is an
    /// error, errors inside its answer are left as values (a batched call's, one per operation).
    pub(super) async fn send_raw(&self, conn: &mut Conn) -> ::redis::RedisResult<::redis::Value> {
        use ::redis::aio::ConnectionLike;
        if let Some(wait) = self.lua.0.wait {
            return self.send_replicated(conn, wait).await;
        }
        let top = |v: ::redis::Value| match v {
            ::redis::Value::ServerError(e) => Err(::redis::RedisError::from(e)),
            v => Ok(v),
        };
        match top(conn.req_packed_command(&self.cmd).await?) {
            Err(e)
                if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
            {
                top(conn.req_packed_command(&self.eval()).await?)
            }
            r => r,
        }
    }
}

impl ScriptCall {
    /// [`ScriptCall::send_raw`] for a script whose writes must reach `wait`'s replicas: the call
    /// and `WAIT` go together (one round trip; the server answers `WAIT` once the replicas have
    /// acknowledged everything the connection wrote, or its timeout ran out). Fewer
    /// acknowledgements than asked for is an error ([`NOT_REPLICATED`]), whatever the script
    /// answered. On a cluster the two go to the node serving the call's key (the connection
    /// follows redirections, sending both again).
    async fn send_replicated(
        &self,
        conn: &mut Conn,
        wait: Wait,
    ) -> ::redis::RedisResult<::redis::Value> {
        use ::redis::aio::ConnectionLike;
        let mut conn = conn.waits();
        let mut values = conn
            .req_packed_commands(&with_wait(self.cmd.clone(), wait), 0, 2)
            .await?;
        if no_script(&values) {
            values = conn
                .req_packed_commands(&with_wait(self.eval(), wait), 0, 2)
                .await?;
        }
        replicated_answer(values, wait)
    }

    /// The call's first key (`EVALSHA sha numkeys key …`), if it names one.
    #[cfg(feature = "redis-cluster")]
    pub(crate) fn first_key(&self) -> Option<&str> {
        self.cmd.args_iter().nth(3).and_then(|a| match a {
            ::redis::Arg::Simple(k) => std::str::from_utf8(k).ok(),
            _ => None,
        })
    }

    /// The call with the script's body (`EVAL`), for a server that answered `NOSCRIPT`: sent
    /// as the call was, it goes where the call went (on a cluster, to the node serving its key,
    /// following redirections — a slot mid-migration included), runs the script and leaves it
    /// there for the next `EVALSHA`.
    fn eval(&self) -> ::redis::Cmd {
        let mut eval = ::redis::cmd("EVAL");
        eval.arg(&self.lua.0.body);
        for a in self.cmd.args_iter().skip(2) {
            if let ::redis::Arg::Simple(a) = a {
                eval.arg(a);
            }
        }
        eval
    }
}

/// `call`, then `WAIT` for `wait`'s replicas.
fn with_wait(call: ::redis::Cmd, wait: Wait) -> ::redis::Pipeline {
    let mut pipe = ::redis::pipe();
    pipe.add_command(call)
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(wait.timeout_ms);
    pipe
}

/// Whether a replicated call ([`with_wait`]) was answered `NOSCRIPT`.
fn no_script(values: &[::redis::Value]) -> bool {
    matches!(values.first(), Some(::redis::Value::ServerError(e))
        if e.kind() == Some(::redis::ServerErrorKind::NoScript))
}

/// A replicated call's answer from its replies (the call's, then `WAIT`'s): an error when fewer
/// replicas than `wait` asks for acknowledged it ([`NOT_REPLICATED`]), or when `WAIT` or the call
/// was refused.
fn replicated_answer(
    values: Vec<::redis::Value>,
    wait: Wait,
) -> ::redis::RedisResult<::redis::Value> {
    use ::redis::Value;
    let mut values = values.into_iter();
    let (Some(answer), Some(acked)) = (values.next(), values.next()) else {
        return Err((
            ::redis::ErrorKind::Client,
            "the server answered a call and WAIT with fewer than two replies",
        )
            .into());
    };
    let acked = match acked {
        Value::Int(n) => n,
        Value::ServerError(e) => return Err(e.into()),
        other => {
            return Err((
                ::redis::ErrorKind::Client,
                "WAIT answered no number",
                format!("{other:?}"),
            )
                .into())
        }
    };
    if acked < i64::from(wait.replicas) {
        return Err((
            ::redis::ErrorKind::Client,
            NOT_REPLICATED,
            format!(
                "{acked} of {} acknowledged it within {} ms (replicas, replicas_timeout)",
                wait.replicas, wait.timeout_ms
            ),
        )
            .into());
    }
    match answer {
        Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}

#[cfg(feature = "redis-cluster")]
impl ScriptCall {
    /// Sends the call to the cluster node `route` names, as [`ScriptCall::send`] does.
    pub(super) async fn send_routed<T: ::redis::FromRedisValue>(
        &self,
        conn: Conn,
        route: ::redis::cluster_routing::RoutingInfo,
    ) -> ::redis::RedisResult<T> {
        Ok(::redis::from_redis_value(
            self.send_routed_raw(conn, route).await?.extract_error()?,
        )?)
    }

    /// [`ScriptCall::send_routed`], answering the value as it came, as
    /// [`ScriptCall::send_raw`] does.
    pub(crate) async fn send_routed_raw(
        &self,
        conn: Conn,
        route: ::redis::cluster_routing::RoutingInfo,
    ) -> ::redis::RedisResult<::redis::Value> {
        let Conn::Cluster(mut conn, waits) = conn else {
            return Err((::redis::ErrorKind::Client, "not a cluster connection").into());
        };
        // A routed command's error reply is a value, not an error: made one here.
        let top = |v: ::redis::Value| match v {
            ::redis::Value::ServerError(e) => Err(::redis::RedisError::from(e)),
            v => Ok(v),
        };
        if let Some(wait) = self.lua.0.wait {
            // The call and `WAIT` on the one node's connection, as on one server.
            let ::redis::cluster_routing::RoutingInfo::SingleNode(node) = route.clone() else {
                return Err((
                    ::redis::ErrorKind::Client,
                    "a replicated call goes to one node",
                )
                    .into());
            };
            let mut conn = waits.unwrap_or(conn);
            let pipe = with_wait(self.cmd.clone(), wait);
            let mut values = conn.route_pipeline(pipe, 0, 2, node.clone()).await?;
            if no_script(&values) {
                let pipe = with_wait(self.eval(), wait);
                values = conn.route_pipeline(pipe, 0, 2, node).await?;
            }
            return replicated_answer(values, wait);
        }
        let sent = conn.route_command(self.cmd.clone(), route.clone()).await;
        match sent.and_then(top) {
            Err(e)
                if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
            {
                top(conn.route_command(self.eval(), route).await?)
            }
            r => r,
        }
    }
}

/// The store's scripts, each with its hash.
pub(super) struct Scripts {
    #[cfg(feature = "redlock")]
    pub(super) raise_fence: Lua,
    pub(super) acquire: Lua,
    /// The acquisition of a permit ([`ACQUIRE_PERMIT`]).
    pub(super) acquire_permit: Lua,
    pub(super) renew: Lua,
    /// The renewal script for several slots of one cluster node.
    #[cfg(feature = "redis-cluster")]
    pub(super) renew_node: Lua,
    pub(super) release: Lua,
    pub(super) withdraw: Lua,
    pub(super) force: Lua,
    /// The release of one holder's lease or permits ([`FORCE_HOLDER`]).
    pub(super) force_holder: Lua,
    pub(super) mark_watched: Lua,
}

impl Scripts {
    /// The scripts of a store whose grants and renewals wait for `wait`'s replicas.
    pub(super) fn new(wait: Option<Wait>) -> Self {
        let s = |body: &str| Lua::new(format!("{PRELUDE}{body}"));
        Scripts {
            #[cfg(feature = "redlock")]
            raise_fence: Lua::new(RAISE_FENCE.to_owned()),
            acquire: Lua::coalesced(
                SERVER_MS,
                format!("{ACQUIRE_FREE}{PRELUDE}{ACQUIRE}"),
                (2, 6),
                ACQUIRE_LANE,
                wait,
            ),
            acquire_permit: Lua::coalesced(
                "",
                format!("{PRELUDE}{ACQUIRE_PERMIT}"),
                (2, 6),
                PERMIT_LANE,
                wait,
            ),
            renew: Lua::waiting(format!("{RENEW_KEYS}{PRELUDE}{RENEW}"), wait),
            #[cfg(feature = "redis-cluster")]
            renew_node: Lua::waiting(format!("{RENEW_NODE_ARGS}{PRELUDE}{RENEW}"), wait),
            release: Lua::coalesced(
                "",
                format!("{RELEASE_OURS}{PRELUDE}{RELEASE}"),
                (2, 3),
                RELEASE_LANE,
                None,
            ),
            withdraw: s(WITHDRAW),
            force: s(FORCE),
            force_holder: s(FORCE_HOLDER),
            mark_watched: s(MARK_WATCHED),
        }
    }
}

/// The code of the error a node-form batch answers for an operation whose key the node does not
/// serve.
#[cfg(feature = "redis-cluster")]
pub(super) const ELSEWHERE: &str = "ELSEWHERE";

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
    pub(super) node: Lua,
    pub(super) keys: usize,
    pub(super) args: usize,
    /// The coalescing lane its calls queue in ([`ACQUIRE_LANE`], [`RELEASE_LANE`],
    /// [`PERMIT_LANE`]).
    pub(super) lane: usize,
}

impl Batched {
    /// The batched form of `prologue` then `body` (a script that takes `keys` keys and `args`
    /// arguments, and returns a value on every path), queued in `lane`. The prologue runs once
    /// per call; the body once per operation, as a function whose keys and arguments are those
    /// of its operation (`KEYS[n]` in the body reads `KEYS[o + n]`, `o` the operation's offset:
    /// no table per operation). The body must not name a variable of its own `o` or `p`.
    fn new(
        prologue: &str,
        body: &str,
        keys: usize,
        args: usize,
        lane: usize,
        wait: Option<Wait>,
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

/// `s` as a JSON string (as the scripts find a token in a record's text).
pub(super) fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Appends `s` as a JSON string (writing into a `Vec` cannot fail, nor can serialising a `str`).
pub(super) fn json_push(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(out, s);
}

#[cfg(test)]
mod tests {
    use super::offset;

    /// A batched body's own variable named `o` or `p` would hide the operation's offsets.
    #[test]
    fn batched_bodies_leave_the_offsets_alone() {
        let bodies = [
            super::ACQUIRE_FREE,
            super::PRELUDE,
            super::ACQUIRE,
            super::RELEASE_OURS,
            super::RELEASE,
        ];
        for body in bodies {
            for line in body.lines().map(str::trim) {
                let names = line.strip_prefix("local ").unwrap_or("");
                let names = names.split('=').next().unwrap_or("");
                for name in names.split(',').map(str::trim) {
                    assert!(name != "o" && name != "p", "a local `{name}`: {line}");
                }
                for fun in ["function(o", "function(p", "for o ", "for p "] {
                    assert!(!line.contains(fun), "{line}");
                }
            }
        }
    }

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
        let scripts = super::Scripts::new(None);
        for lua in [&scripts.acquire, &scripts.acquire_permit, &scripts.release] {
            let node = lua.batched().map_or("", |b| b.node.0.body.as_str());
            assert_eq!(node.matches("redis.pcall('GET'").count(), 1, "{node}");
            assert_eq!(node.matches(super::FIRST_READ).count(), 1, "{node}");
            assert!(!node.contains("EXISTS"), "{node}");
            assert!(node.contains("local raw = pre\n"), "{node}");
        }
    }
}
