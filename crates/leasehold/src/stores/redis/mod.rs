//! The Redis store (`redis://[user:pass@]host:port/db`, `rediss://…` over TLS,
//! `redis+unix:///path/to/redis.sock?db=N&user=…&pass=…` over a Unix socket,
//! `redis+sentinel://…` / `rediss+sentinel://…` through Redis Sentinel): one Redis server.
//!
//! Checklist — native TTL: yes (`PX` on the record key; expiry judged by the server's clock, read
//! with `TIME` inside the scripts); watch: yes (pub/sub on a channel named like the record key:
//! force-release and waiter withdrawal always publish, a release whenever a contender waits — a
//! registered waiter, or a subscribed one, whose attempt marked the record `"watched":true`, so an
//! uncontended release costs no `PUBLISH`); liveness: no (a killed holder's
//! lease ends with its TTL); fence: `INCR` of a per-key counter key without TTL, in the acquire
//! script. The fence goes backwards only if the server loses the counter key (a restart without
//! persistence, `FLUSHALL`, or an operator deleting `…fence:KEY`). Fences are exact up to 2^53
//! (Lua numbers are doubles).
//!
//! # Records
//! The lease is a plain string key `<prefix><key>` (default prefix `leasehold:lock:`, e.g.
//! `?prefix=agent:lock:`) holding the JSON record, with a server-side `PX` TTL, so operators use
//! `redis-cli GET`, `PTTL` and `DEL` (a force release) as usual. The fence counter lives at
//! `<fence prefix><key>` (default: the prefix with its trailing `lock:` replaced by `fence:`, else
//! `leasehold:fence:`; `?fence_prefix=` overrides; neither prefix may start with the other, so no
//! key can collide with a counter). Times inside the record are Unix milliseconds of the server.
//!
//! # Other clients
//! A value under a record key that is not a record of ours (the random token redis-py's `Lock`,
//! redsync or redlock-go set with `SET NX PX`, JSON without our `key` and `fence`, a value of
//! another type) is another client's lock: held by an unknown holder until the server expires it,
//! and never replaced. Acquisitions answer it as held (its type, length and
//! `PTTL` in the holder's description); one without a TTL is held until someone deletes it;
//! inspection and listing show it the same way; force release leaves it. A holder whose own record
//! was overwritten that way has lost its lease (`TakenOver`).
//!
//! Every operation is one script call (`EVALSHA`, sent again as `EVAL` with the script on
//! `NOSCRIPT`): acquire-when-free, renew and release each cost one round trip. Renewals are
//! batched per period; acquisitions and releases made at once by many tasks share calls while
//! the server is busy (`coalesce`; each still answered on its own).
//!
//! # Replicas
//! Replication is asynchronous: a failover can lose the last grants. `?replicas=N` (see
//! [`RedisOptions::replicas`]) sends each acquire and renewal call with Redis's `WAIT N`
//! (`?replicas_timeout=`) in the same round trip and answers it only once N replicas have it; a
//! grant they did not acknowledge is released and the acquisition fails, retryably:
//!
//! ```no_run
//! # async fn f() -> leasehold::Result<()> {
//! let store = leasehold::open_store(
//!     "redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster?replicas=1&replicas_timeout=250ms",
//! )
//! .await?;
//! # Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupReport, Inspection,
    LockStore, LostReason, ReleaseOutcome, RenewOutcome,
};
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use async_trait::async_trait;
use futures_util::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;

#[cfg(feature = "redis-cluster")]
pub mod cluster;
pub(crate) mod coalesce;

/// Shared Lua helpers: server time, record decoding, waiter liveness.
const PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A record as a table, nil (none) or 'corrupt': not a record of ours (another client's lock
-- token, JSON without our key and fence, or an error table from `redis.pcall`: a value of
-- another type).
local function decode(raw)
  if not raw then return nil end
  local ok, r = pcall(cjson.decode, raw)
  if ok and type(r) == 'table' and type(r.key) == 'string' and type(r.fence) == 'number' then return r end
  return 'corrupt'
end
-- A value we cannot read under `k` is another client's lock, held until the server expires it:
-- {2, its type, its PTTL in ms (-1: no TTL, held until deleted), now, its length (-1: not a
-- string)}. It is never replaced.
local function foreign(k, raw)
  local kind = redis.call('TYPE', k)
  if type(kind) == 'table' then kind = kind.ok end
  local len = -1
  if type(raw) == 'string' then len = #raw end
  return {2, kind, redis.call('PTTL', k), now, len}
end
local function str(v) if v == nil or v == cjson.null then return nil end return v end
local function num(v) if v == nil or v == cjson.null then return 0 end return tonumber(v) or 0 end
local function live_waiter(r) return str(r.waiter_token) ~= nil and num(r.waiter_expires) > now end
local function held(r) return str(r.token) ~= nil and num(r.expires) > now end
local function clear_waiter(r) r.waiter = cjson.null; r.waiter_token = cjson.null; r.waiter_expires = cjson.null end
-- Store the record; the key lives while the lease or a waiter registration does.
local function put(r, k)
  local until_ms = 0
  if held(r) then until_ms = num(r.expires) end
  if live_waiter(r) then until_ms = math.max(until_ms, num(r.waiter_expires)) end
  local raw = cjson.encode(r)
  -- cjson writes numbers with 14 significant digits: a larger fence is put back exactly.
  if num(r.fence) >= 1e14 then
    raw = string.gsub(raw, '"fence":[^,}]*', '"fence":' .. string.format('%d', r.fence), 1)
  end
  if until_ms > now then
    redis.call('SET', k, raw, 'PX', until_ms - now)
  else
    redis.call('DEL', k)
  end
  return raw
end
local function freed(r)
  r.holder = cjson.null; r.token = cjson.null; r.expires = 0; r.renewed = now
  if not live_waiter(r) then clear_waiter(r) end
  return r
end
"#;

/// Comes before the acquire script's body ([`ACQUIRE_FREE`]), and before the whole of its batched
/// form, so that a batch reads the server's time once: `server_ms()`, the server's time in
/// milliseconds as a string, read at its first use in the call, from TIME's seconds and
/// microseconds strings (the microseconds' first digits, zero-padded to three): no number
/// conversion. The operations of one batch run together (nothing else runs on the server
/// meanwhile), so they share one time; later ones' leases then end a little earlier by the
/// record's times, never later (the key's TTL is counted by the server from its `SET`).
const SERVER_MS: &str = r#"
local server_ms_read
local function server_ms()
  if not server_ms_read then
    local t = redis.call('TIME')
    local us = t[2]
    if #us > 3 then server_ms_read = t[1] .. string.rep('0', 6 - #us) .. string.sub(us, 1, -4) else server_ms_read = t[1] .. '000' end
  end
  return server_ms_read
end
"#;

/// The acquire script's fast path, run after [`SERVER_MS`] and before the [`PRELUDE`] (whose
/// helpers it does not need): a key free and never waited for.
///
/// KEYS: record, fence counter. ARGV: the record up to its fence (`{"key":…,"holder":…,
/// "token":…,"fence":`), the record after its times (`,"ttl_ms":…,"waiter":null,…,"labels":…}`),
/// ttl_ms, the number of fences to reserve, waiter_ttl_ms (0: none), then 1 if the caller waits
/// for change notifications (subscribed), else 0. The client builds both parts, so the server
/// only adds the fence and its times, and the call carries six arguments.
///
/// Returns `"<fence> <now>"` when it granted a key that was free (the record is then exactly what
/// the caller sent, with that fence and time), else {1, record} granted or {0, record or ''} held.
const ACQUIRE_FREE: &str = r#"
-- `pcall`: a value of another type (an operator's hash) is an error table, read as corrupt.
local raw = redis.pcall('GET', KEYS[1])
if not raw then
  local ns = server_ms()
  -- Each number formatted once, as an integer: Lua formats a number on every concatenation, with
  -- the floating-point '%.14g' (several times slower than '%d', and an exponent from 1e14 up);
  -- the TTL goes to PX as the string sent, not a number Redis would format again.
  local fence = string.format('%d', redis.call('INCRBY', KEYS[2], ARGV[4]))
  redis.call('SET', KEYS[1], ARGV[1] .. fence .. ',"acquired":' .. ns .. ',"renewed":' .. ns
    .. ',"expires":' .. string.format('%d', ns + ARGV[3]) .. ARGV[2], 'PX', ARGV[3])
  -- A string, not a table: the cheapest reply to build.
  return fence .. ' ' .. ns
end
"#;

/// The rest of the acquire script (after [`ACQUIRE_FREE`] and the [`PRELUDE`]): a record exists.
/// A held key gets the caller as its registered waiter (`waiter_ttl_ms` > 0), or else, when the
/// caller is subscribed, the mark `"watched":true` so that its release publishes. A value that is
/// not a record of ours is another client's lock: answered as held (`foreign` in the
/// [`PRELUDE`]), left as it is.
const ACQUIRE: &str = r#"
-- The caller's holder and token, from the record it sent (its head is JSON once closed).
local me = cjson.decode(ARGV[1] .. '0}')
local token = me.token
local r = decode(raw)
if r == 'corrupt' then return foreign(KEYS[1], raw) end
if type(r) == 'table' then
  local mine = str(r.waiter_token) == token
  if held(r) or (live_waiter(r) and not mine) then
    local wttl = tonumber(ARGV[5])
    if wttl > 0 and (mine or not live_waiter(r)) then
      local fresh = mine and live_waiter(r) and num(r.waiter_expires) >= now + math.floor(wttl * 2 / 3)
      if not fresh then
        r.waiter = me.holder; r.waiter_token = token; r.waiter_expires = now + wttl
        raw = put(r, KEYS[1])
      end
    elseif ARGV[6] == '1' and r.watched ~= true then
      r.watched = true
      raw = put(r, KEYS[1])
    end
    return {0, raw}
  end
end
local fence = redis.call('INCRBY', KEYS[2], ARGV[4])
local ttl = tonumber(ARGV[3])
local g = cjson.decode(ARGV[1] .. string.format('%d', fence) .. ',"acquired":' .. now
  .. ',"renewed":' .. now .. ',"expires":' .. (now + ttl) .. ARGV[2])
if type(r) == 'table' and live_waiter(r) and str(r.waiter_token) ~= token then
  g.waiter = r.waiter; g.waiter_token = r.waiter_token; g.waiter_expires = r.waiter_expires
end
-- Contenders that marked the record still wait: our release must publish for them.
if type(r) == 'table' and r.watched == true then g.watched = true end
return {1, put(g, KEYS[1])}
"#;

/// The renewal script's arguments on one server and on a cluster's slot: KEYS: records. ARGV:
/// token, ttl_ms, token as a JSON string per key.
const RENEW_KEYS: &str = "local keys, args = KEYS, ARGV\n";

/// The renewal script's arguments on a cluster's node, for records in any of the slots it serves
/// (the keys are not declared, since declared keys must share one slot): ARGV: the number of
/// records n, n records, then token, ttl_ms, token as a JSON string per record. A record whose
/// slot the node does not serve (a failover, a resharding: the call finds it moved or moving
/// away) is answered `elsewhere`, and renewed by a call naming its key, which follows the
/// cluster's redirections. The flag lets one call touch keys of several slots.
#[cfg(feature = "redis-cluster")]
const RENEW_NODE_ARGS: &str = r#"#!lua flags=allow-cross-slot-keys
local n = tonumber(ARGV[1])
local keys, args = {}, {}
for i = 1, n do keys[i] = ARGV[i + 1] end
for i = n + 2, #ARGV do args[#args + 1] = ARGV[i] end
"#;

/// The renewal script, after its arguments ([`RENEW_KEYS`], [`RENEW_NODE_ARGS`]) and the
/// [`PRELUDE`]. Returns three values per record: 1, record, '' | 0, 'released'|'expired'|'taken',
/// holder | 0, 'elsewhere', the server's error. One call renews a whole batch. A record nobody
/// waits for is renewed by rewriting its times in place, without decoding it.
const RENEW: &str = r#"
local out = {}
for i, k in ipairs(keys) do
  local token = args[3 * i - 2]
  local ttl = tonumber(args[3 * i - 1])
  -- `pcall`: a value of another type is read as corrupt, and a key of a slot this node does not
  -- serve (only possible for undeclared keys) is left to a call naming it.
  local raw = redis.pcall('GET', k)
  local a, b, c = 0, 'released', ''
  if type(raw) == 'table' and not string.find(tostring(raw.err), 'WRONGTYPE', 1, true) then
    b = 'elsewhere'; c = tostring(raw.err)
  elseif type(raw) == 'string' and string.find(raw, '"waiter_token":null', 1, true)
      and string.find(raw, '"token":' .. args[3 * i], 1, true) then
    -- Ours and nobody waits: rewrite the times without decoding.
    if (tonumber(string.match(raw, '"expires":(%d+)')) or 0) > now then
      -- Integers formatted as such (see the acquire script), the TTL passed on as sent.
      raw = string.gsub(raw, '"renewed":%d+', '"renewed":' .. string.format('%d', now), 1)
      raw = string.gsub(raw, '"expires":%d+', '"expires":' .. string.format('%d', now + ttl), 1)
      raw = string.gsub(raw, '"ttl_ms":%d+', '"ttl_ms":' .. args[3 * i - 1], 1)
      redis.call('SET', k, raw, 'PX', args[3 * i - 1])
      a = 1; b = raw
    else
      b = 'expired'
    end
  else
    local r = decode(raw)
    if r == 'corrupt' then
      b = 'taken'; c = 'an overwritten (unreadable) record'
    elseif r ~= nil and str(r.token) ~= nil then
      if str(r.token) ~= token then
        b = 'taken'; c = tostring(str(r.holder) or '')
      elseif num(r.expires) <= now then
        b = 'expired'
      else
        r.renewed = now; r.expires = now + ttl; r.ttl_ms = ttl
        if not live_waiter(r) then clear_waiter(r) end
        a = 1; b = put(r, k)
      end
    end
  end
  out[#out + 1] = a; out[#out + 1] = b; out[#out + 1] = c
end
return out
"#;

/// The release script's fast path, run before the [`PRELUDE`]: our record with no registered
/// waiter has a key TTL equal to the lease's, so its key existing means the lease is live. It
/// publishes only when a subscribed contender marked the record `"watched":true`.
///
/// KEYS: record. ARGV: token, token as a JSON string. Returns 1 released, 0 not ours (2: ours but
/// already expired).
const RELEASE_OURS: &str = r#"
local raw = redis.pcall('GET', KEYS[1])
if not raw then return 0 end
if type(raw) == 'string' and string.find(raw, '"token":' .. ARGV[2], 1, true) and string.find(raw, '"waiter_token":null', 1, true) then
  redis.call('DEL', KEYS[1])
  if string.find(raw, '"watched":true', 1, true) then
    redis.call('PUBLISH', KEYS[1], 'released')
  end
  return 1
end
"#;

/// The rest of the release script (after [`RELEASE_OURS`] and the [`PRELUDE`]).
const RELEASE: &str = r#"
local r = decode(raw)
if type(r) ~= 'table' or str(r.token) ~= ARGV[1] then return 0 end
local was_held = held(r)
put(freed(r), KEYS[1])
redis.call('PUBLISH', KEYS[1], 'released')
if was_held then return 1 end
return 2
"#;

/// KEYS: record. ARGV: token.
const WITHDRAW: &str = r#"
local r = decode(redis.pcall('GET', KEYS[1]))
if type(r) ~= 'table' or str(r.waiter_token) ~= ARGV[1] then return 0 end
clear_waiter(r)
put(r, KEYS[1])
redis.call('PUBLISH', KEYS[1], 'withdrawn')
return 1
"#;

/// KEYS: record. ARGV: the fence of the lease to mark, or '' for whichever is held. Marks a held
/// record `"watched":true`, so that its release publishes, keeping everything else (the record's
/// text and the key's TTL). Returns 0 when asked for a fence and the key holds no lease with it
/// (no record, another fence), else 1: marked now or before, or nothing to mark (an unreadable
/// record, one that is free by the server's clock but not yet taken).
const MARK_WATCHED: &str = r#"
local raw = redis.pcall('GET', KEYS[1])
if type(raw) ~= 'string' then if ARGV[1] == '' then return 1 end return 0 end
-- The fence compared as written: exact at any size.
if ARGV[1] ~= '' and string.match(raw, '"fence":(%d+)') ~= ARGV[1] then return 0 end
if string.find(raw, '"watched":true', 1, true) then return 1 end
local r = decode(raw)
if type(r) ~= 'table' or not held(r) then return 1 end
if string.sub(raw, -1) == '}' then
  -- Added as text: the record stays byte for byte as it was, and so does the key's TTL.
  redis.call('SET', KEYS[1], string.sub(raw, 1, -2) .. ',"watched":true}', 'KEEPTTL')
else
  r.watched = true
  put(r, KEYS[1])
end
return 1
"#;

/// KEYS: record. Returns the record as it was (or false; a value of another type is false too).
const FORCE: &str = r#"
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' then return false end
local r = decode(raw)
if type(r) ~= 'table' then return raw or false end
if str(r.token) ~= nil then
  put(freed(r), KEYS[1])
  redis.call('PUBLISH', KEYS[1], 'force-released')
end
return raw
"#;

#[cfg(feature = "redlock")]
/// Raises a fence counter to at least `ARGV[1]` (never lowers it); used by Redlock so that every
/// granting node's counter reaches the fence the majority granted.
const RAISE_FENCE: &str = r#"
local c = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if c < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"#;

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
    /// The form that runs many calls of it in one ([`coalesce`]), for the acquire and release
    /// scripts.
    batched: Option<coalesce::Batched>,
    /// The replicas each call's writes must reach ([`RedisOptions::replicas`]), for the acquire
    /// and renewal scripts of a store that asks for them.
    wait: Option<Wait>,
}

impl Lua {
    fn new(body: String) -> Self {
        Self::waiting(body, None)
    }

    /// A script whose calls wait for `wait`'s replicas ([`ScriptCall::send_raw`]).
    pub(super) fn waiting(body: String, wait: Option<Wait>) -> Self {
        let hash = ::redis::Script::new(&body).get_hash().to_owned();
        Lua(Arc::new(LuaText {
            hash,
            body,
            batched: None,
            wait,
        }))
    }

    /// A script (`prologue`, then `body`) taking `keys` keys and `args` arguments whose calls are
    /// coalesced in `lane` while the server is busy ([`coalesce`]), and wait for `wait`'s
    /// replicas, alone or batched.
    fn coalesced(
        prologue: &str,
        body: String,
        (keys, args): (usize, usize),
        lane: usize,
        wait: Option<Wait>,
    ) -> Self {
        let batched = coalesce::Batched::new(prologue, &body, keys, args, lane, wait);
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
    fn batched(&self) -> Option<&coalesce::Batched> {
        self.0.batched.as_ref()
    }

    /// A call of this script taking `keys` keys; the caller appends the keys, then the arguments
    /// (`args` of them, about `bytes` long in all: the command's buffers are sized once, since
    /// growing them costs more than the rest of building the call).
    fn prepare(&self, keys: usize, args: usize, bytes: usize) -> ScriptCall {
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
    lua: Lua,
    cmd: ::redis::Cmd,
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
    async fn send<T: ::redis::FromRedisValue>(&self, conn: &mut Conn) -> ::redis::RedisResult<T> {
        Ok(::redis::from_redis_value(
            self.send_raw(conn).await?.extract_error()?,
        )?)
    }

    /// [`ScriptCall::send`], answering the value as it came: an error reply to the call is an
    /// error, errors inside its answer are left as values (a batched call's, one per operation).
    async fn send_raw(&self, conn: &mut Conn) -> ::redis::RedisResult<::redis::Value> {
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

/// The description of the error a replicated write answers when too few replicas acknowledged it
/// ([`ScriptCall::send_replicated`]).
const NOT_REPLICATED: &str = "the write did not reach the replicas asked for";

#[cfg(feature = "redis-cluster")]
impl ScriptCall {
    /// Sends the call to the cluster node `route` names, as [`ScriptCall::send`] does.
    async fn send_routed<T: ::redis::FromRedisValue>(
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
struct Scripts {
    #[cfg(feature = "redlock")]
    raise_fence: Lua,
    acquire: Lua,
    renew: Lua,
    /// The renewal script for several slots of one cluster node.
    #[cfg(feature = "redis-cluster")]
    renew_node: Lua,
    release: Lua,
    withdraw: Lua,
    force: Lua,
    mark_watched: Lua,
}

impl Scripts {
    /// The scripts of a store whose grants and renewals wait for `wait`'s replicas.
    fn new(wait: Option<Wait>) -> Self {
        let s = |body: &str| Lua::new(format!("{PRELUDE}{body}"));
        Scripts {
            #[cfg(feature = "redlock")]
            raise_fence: Lua::new(RAISE_FENCE.to_owned()),
            acquire: Lua::coalesced(
                SERVER_MS,
                format!("{ACQUIRE_FREE}{PRELUDE}{ACQUIRE}"),
                (2, 6),
                coalesce::ACQUIRE_LANE,
                wait,
            ),
            renew: Lua::waiting(format!("{RENEW_KEYS}{PRELUDE}{RENEW}"), wait),
            #[cfg(feature = "redis-cluster")]
            renew_node: Lua::waiting(format!("{RENEW_NODE_ARGS}{PRELUDE}{RENEW}"), wait),
            release: Lua::coalesced(
                "",
                format!("{RELEASE_OURS}{PRELUDE}{RELEASE}"),
                (1, 2),
                coalesce::RELEASE_LANE,
                None,
            ),
            withdraw: s(WITHDRAW),
            force: s(FORCE),
            mark_watched: s(MARK_WATCHED),
        }
    }
}

/// Options of the Redis store.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Record key prefix (default `leasehold:lock:`).
    pub prefix: String,
    /// Fence counter prefix (default derived from `prefix`, see the module docs).
    pub fence_prefix: Option<String>,
    /// Per-command response timeout (default 2 s); a server that stops answering makes calls fail
    /// after this, so a holder's `lost()` fires before its TTL runs out.
    pub timeout: Duration,
    /// For `rediss://`: a PEM file of the CA that signed the server's certificate (`?ca=`);
    /// default: the system's trust store.
    pub ca_file: Option<std::path::PathBuf>,
    /// For `rediss://` to a server that asks clients for a certificate (`tls-auth-clients yes`,
    /// Redis's default with TLS): PEM files of the client's certificate and key (`?cert=` and
    /// `?key=`, given together).
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Replicas that must have each grant and renewal before the store answers it
    /// (`?replicas=N`; default 0, none): each acquire and renewal script call is followed, on
    /// the same connection and in the same round trip, by Redis's `WAIT N timeout`. When fewer
    /// replicas acknowledge in time, a grant is released and the acquisition fails with a
    /// retryable [`Error::Store`]; a renewal fails the same way, so a holder whose renewals stay
    /// unacknowledged sees `lost()` once its lease could have expired. This narrows what a
    /// failover can lose (a promoted replica that lacks the last grant lets in a second holder)
    /// without closing it: `WAIT` is not a consensus (see the README). One server, plain or
    /// behind Sentinel, and a cluster (each primary's replicas); refused on Redlock. An ACL user
    /// needs `+wait`: without it, acquisitions fail with a non-retryable `NOPERM` error (and
    /// their grants are released). Grants and renewals then go on a connection of their own (a
    /// second one per server), since `WAIT` holds its connection until answered: releases,
    /// inspections and listings are never held up behind it.
    pub replicas: u32,
    /// How long a grant or renewal waits for the replicas' acknowledgements
    /// (`?replicas_timeout=`; default half of `timeout`, and always less than it).
    pub replicas_timeout: Option<Duration>,
}

/// The replicas a replicated write waits for ([`RedisOptions::replicas`]): Redis's `WAIT`
/// arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    replicas: u32,
    timeout_ms: u64,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "leasehold:lock:".into(),
            fence_prefix: None,
            timeout: Duration::from_secs(2),
            ca_file: None,
            client_cert: None,
            replicas: 0,
            replicas_timeout: None,
        }
    }
}

impl RedisOptions {
    /// Reads `prefix`, `fence_prefix`, `timeout`, `replicas`, `replicas_timeout` and the TLS files
    /// (`ca`, `cert`, `key`) from URL query pairs.
    pub(crate) fn from_query<'a>(
        url: &str,
        pairs: impl Iterator<Item = (std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>)>,
        mut opts: RedisOptions,
    ) -> Result<Self> {
        let bad = |reason: String| Error::InvalidUrl {
            url: crate::redact_url(url),
            reason,
        };
        let (mut cert, mut key) = (None, None);
        for (k, v) in pairs {
            match &*k {
                "prefix" => opts.prefix = v.into_owned(),
                "fence_prefix" => opts.fence_prefix = Some(v.into_owned()),
                "ca" => opts.ca_file = Some(v.into_owned().into()),
                "cert" => cert = Some(std::path::PathBuf::from(v.into_owned())),
                "key" => key = Some(std::path::PathBuf::from(v.into_owned())),
                "timeout" => {
                    opts.timeout = humantime::parse_duration(&v)
                        .map_err(|e| bad(format!("timeout {v:?}: {e}")))?
                }
                "replicas" => {
                    opts.replicas = v.parse().map_err(|_| {
                        bad(format!("replicas {v:?}: expected a whole number of replicas"))
                    })?
                }
                "replicas_timeout" => {
                    opts.replicas_timeout = Some(
                        humantime::parse_duration(&v)
                            .map_err(|e| bad(format!("replicas_timeout {v:?}: {e}")))?,
                    )
                }
                other => {
                    return Err(bad(format!(
                        "unknown parameter {other:?} (known: prefix, fence_prefix, timeout, replicas, replicas_timeout, ca, cert, key; db, user, pass for redis+unix)"
                    )))
                }
            }
        }
        opts.client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => opts.client_cert,
            _ => {
                return Err(bad(
                    "?cert= (the client's certificate) and ?key= (its key) go together".into(),
                ))
            }
        };
        Ok(opts)
    }

    /// What a replicated write waits for (`None` when [`RedisOptions::replicas`] is 0), or an
    /// [`Error::InvalidUrl`] for `described` when the wait is 0 (`WAIT` would block for ever) or
    /// not shorter than `timeout` (the call would run out of time first), or is given without
    /// replicas.
    pub(crate) fn wait(&self, described: &str) -> Result<Option<Wait>> {
        let bad = |reason: String| Error::InvalidUrl {
            url: described.to_owned(),
            reason,
        };
        if self.replicas == 0 {
            return match self.replicas_timeout {
                Some(_) => Err(bad(
                    "replicas_timeout is how long to wait for replicas: give replicas=N too".into(),
                )),
                None => Ok(None),
            };
        }
        let timeout = self.replicas_timeout.unwrap_or(self.timeout / 2);
        let ms = timeout.as_millis();
        if ms == 0 || timeout >= self.timeout {
            return Err(bad(format!(
                "replicas_timeout {timeout:?} must be at least 1ms and less than the timeout ({:?})",
                self.timeout
            )));
        }
        Ok(Some(Wait {
            replicas: self.replicas,
            timeout_ms: ms as u64,
        }))
    }

    /// An [`Error::InvalidOption`] when replicas are asked for on Redlock, which does not wait
    /// for them.
    #[cfg(feature = "redlock")]
    pub(crate) fn no_replicas(&self) -> Result<()> {
        if self.replicas == 0 && self.replicas_timeout.is_none() {
            return Ok(());
        }
        Err(Error::option(
            "replicas",
            "replicas and replicas_timeout are not for Redlock, whose nodes are independent primaries (a majority of them is its safeguard)",
        ))
    }

    /// Whether the options name TLS files (`?ca=`, `?cert=`, `?key=`), which only a TLS URL
    /// takes.
    pub(crate) fn names_tls_files(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some()
    }

    /// The TLS material the options name, read from its files: the CA and the client's
    /// certificate and key; `None` when none is named (the system trust store, no client
    /// certificate).
    pub(crate) fn tls_certificates(&self) -> Result<Option<::redis::TlsCertificates>> {
        let read = |what: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| Error::io(what, path.display(), e))
        };
        let root_cert = match &self.ca_file {
            Some(ca) => Some(read("read CA file", ca)?),
            None => None,
        };
        let client_tls = match &self.client_cert {
            Some((cert, key)) => Some(::redis::ClientTlsConfig {
                client_cert: read("read client certificate", cert)?,
                client_key: read("read client key", key)?,
            }),
            None => None,
        };
        Ok(
            (root_cert.is_some() || client_tls.is_some()).then_some(::redis::TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }

    fn fence_prefix(&self) -> String {
        match &self.fence_prefix {
            Some(p) => p.clone(),
            None => match self.prefix.strip_suffix("lock:") {
                Some(base) => format!("{base}fence:"),
                None => "leasehold:fence:".into(),
            },
        }
    }
}

/// The Redis store; see the [module docs](self).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    link: Arc<Link>,
    scripts: Scripts,
    prefix: String,
    fence_prefix: String,
    /// The pub/sub hub and the link generation it was made for.
    hub: tokio::sync::Mutex<Option<(Arc<Hub>, u64)>>,
    renewals: tokio::sync::mpsc::UnboundedSender<RenewJob>,
}

/// Where the store finds its server.
pub(crate) enum Origin {
    /// One address (a name that may move to another server: DNS, a proxy, a managed endpoint).
    Fixed,
    /// Sentinels that name the primary of a master group (`redis+sentinel://`).
    Sentinel(Sentinels),
    /// A Redis Cluster (`redis+cluster://`): the connection routes each call to the node serving
    /// its key's slot and follows the cluster's moves itself; pub/sub goes to that node too.
    #[cfg(feature = "redis-cluster")]
    Cluster(crate::stores::redis::cluster::ClusterNodes),
}

/// The command connection: to one server, or to a Redis Cluster; with, for a store whose grants
/// and renewals wait for replicas ([`RedisOptions::replicas`]), a second one made from the same
/// client that carries those calls alone ([`Conn::waits`]).
#[derive(Clone)]
pub(crate) enum Conn {
    One(ConnectionManager, Option<ConnectionManager>),
    #[cfg(feature = "redis-cluster")]
    Cluster(
        ::redis::cluster_async::ClusterConnection,
        Option<::redis::cluster_async::ClusterConnection>,
    ),
}

impl Conn {
    /// A connection to one server made from `client` on first use, with a second one for calls
    /// that wait for replicas when `waits`.
    fn lazy(
        client: &::redis::Client,
        config: &ConnectionManagerConfig,
        waits: bool,
    ) -> ::redis::RedisResult<Self> {
        let new = || ConnectionManager::new_lazy_with_config(client.clone(), config.clone());
        Ok(Conn::One(new()?, if waits { Some(new()?) } else { None }))
    }

    /// The connection for calls that wait for replicas (`WAIT`, which holds the connection it
    /// is sent on until the replicas answer or its timeout runs out): its own, so that while a
    /// replica does not answer, releases, inspections and listings are not held up behind it.
    /// A store without replicas has one connection for all.
    fn waits(&self) -> Conn {
        match self {
            Conn::One(calls, waits) => Conn::One(waits.as_ref().unwrap_or(calls).clone(), None),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(calls, waits) => {
                Conn::Cluster(waits.as_ref().unwrap_or(calls).clone(), None)
            }
        }
    }
}

impl ::redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        match self {
            Conn::One(c, _) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c, _) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        match self {
            Conn::One(c, _) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c, _) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::One(c, _) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c, _) => c.get_db(),
        }
    }
}

/// Makes a client for the data server at (`ip`, `port`), with the store's credentials, database
/// and TLS settings.
type NodeClient = Arc<dyn Fn(&str, u16) -> Result<::redis::Client> + Send + Sync>;

/// The sentinels of a `redis+sentinel://` (or `rediss+sentinel://`) store.
pub(crate) struct Sentinels {
    /// A client for each sentinel (over TLS for `rediss+sentinel://`).
    sentinels: Vec<::redis::Client>,
    master: String,
    node: NodeClient,
    /// The tasks following the sentinels' `+switch-master` announcements, one per sentinel.
    followers: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Sentinels {
    /// A client for the primary the sentinels name, checked (`ROLE`) to be one: all sentinels are
    /// asked at once and the first good answer is taken; each answer takes at most `timeout`.
    /// When none is good, the error is retryable if any sentinel's was (one that knows no such
    /// master does not make the others' outage final).
    async fn primary(&self, described: &str, timeout: Duration) -> Result<::redis::Client> {
        let mut asks: futures_util::stream::FuturesUnordered<_> = self
            .sentinels
            .iter()
            .map(|s| self.ask(s, described, timeout))
            .collect();
        let mut failure: Option<Error> = None;
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(client) => return Ok(client),
                Err(e) => {
                    if failure.as_ref().map_or(true, |f| !f.is_retryable()) {
                        failure = Some(e);
                    }
                }
            }
        }
        Err(failure.unwrap_or_else(|| Error::Unavailable {
            source: None,
            store: described.to_owned(),
            detail: "no sentinels".into(),
        }))
    }

    /// The primary `sentinel` names for the master group, checked to be one.
    async fn ask(
        &self,
        sentinel: &::redis::Client,
        described: &str,
        timeout: Duration,
    ) -> Result<::redis::Client> {
        let named: Option<(String, u16)> =
            bounded(described, timeout, "no answer from a sentinel", async {
                let mut conn = sentinel.get_multiplexed_async_connection().await?;
                ::redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let Some((ip, port)) = named else {
            return Err(Error::Store {
                source: None,
                store: described.to_owned(),
                detail: format!("the sentinels monitor no master named {:?}", self.master),
                retryable: false,
            });
        };
        let client = (self.node)(&ip, port)?;
        let role: Vec<::redis::Value> = bounded(
            described,
            timeout,
            "no answer from the primary the sentinels name",
            async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                ::redis::cmd("ROLE").query_async(&mut conn).await
            },
        )
        .await?;
        let first = role
            .first()
            .and_then(|v| ::redis::from_redis_value_ref::<String>(v).ok());
        if first.as_deref() != Some("master") {
            return Err(Error::Unavailable {
                source: None,
                store: described.to_owned(),
                detail: format!("{ip}:{port}, which the sentinels name, is not a primary (yet)"),
            });
        }
        Ok(client)
    }
}

/// The store's command connection, replaced when its server stops being the primary.
///
/// After a failover (Sentinel, a managed service) the old primary is often still up, demoted to a
/// replica, and answers every write with `READONLY`. The connection manager reconnects only when a
/// connection breaks, and always to the same address, so the link replaces it: on `READONLY` at
/// once (for a fixed address, connecting again resolves the name again; under Sentinel, to the
/// primary the sentinels name), and under Sentinel also when the server is unreachable and the
/// sentinels name another primary.
struct Link {
    origin: Origin,
    config: ConnectionManagerConfig,
    described: String,
    timeout: Duration,
    /// The connection and its generation (so that calls failing together replace it once).
    current: Mutex<(u64, Conn)>,
    /// Whether the connection has a second one for calls that wait for replicas ([`Conn::waits`]).
    waits: bool,
    /// The client the connection was made from (the pub/sub connection is made from it too).
    client: Mutex<::redis::Client>,
    /// A sentinel lookup, or a new cluster connection, is under way (one at a time).
    looking_up: std::sync::atomic::AtomicBool,
    /// A call is trying a new connection after one could not be made ([`Link::connect_anew`]).
    connecting_anew: std::sync::atomic::AtomicBool,
    /// When a call that ran out of time last started a new connection ([`Link::timed_out`]).
    reconnected: Mutex<Option<std::time::Instant>>,
    /// The acquire and release calls in flight, and those queued for the next batch
    /// ([`coalesce`]).
    lanes: Arc<coalesce::Lanes>,
}

/// Clears a flag however the work it marks ends (its call dropped, say).
struct Cleared<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for Cleared<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The least time between two new connections made because calls ran out of time.
const RECONNECT_GAP: Duration = Duration::from_secs(1);

impl Link {
    /// Sends what `call` sends on a clone of the connection, bounded by the store's timeout. A
    /// `READONLY` answer is a retryable [`Error::Unavailable`] that replaces the connection.
    ///
    /// A connection that could not be made for a reason other than I/O (the server answered
    /// something that is not Redis, or refused the credentials) is kept by the connection manager,
    /// which connects again only after an I/O error: every later call would get that error, even
    /// once the server is back on its port or accepts the credentials. So such a failure is
    /// checked with one new connection attempt, made by the call (one call at a time; the others
    /// answer the error at once): when it connects, the link takes a new connection and the call
    /// is sent on it; when not, the call answers the error, which is current. On a cluster, whose
    /// connection says only "no connections found" when it could not connect to a node, the call
    /// answers the refusal behind that instead, when the nodes refuse the connection
    /// ([`Link::cluster_refusal`]).
    async fn send<T, F>(self: &Arc<Self>, call: impl Fn(Conn) -> F) -> Result<T>
    where
        F: std::future::Future<Output = ::redis::RedisResult<T>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let (generation, conn) = self.current.lock().clone();
        let mut answer = tokio::time::timeout_at(deadline, call(conn)).await;
        let mut on = generation;
        if let Ok(Err(e)) = &answer {
            if connection_refused(e) && self.connect_anew(generation, deadline).await {
                let (generation, conn) = self.current.lock().clone();
                on = generation;
                answer = tokio::time::timeout_at(deadline, call(conn)).await;
            }
        }
        #[cfg(feature = "redis-cluster")]
        if let Ok(Err(e)) = &answer {
            if e.kind() == ::redis::ErrorKind::ClusterConnectionNotFound {
                if let Some(refused) = self.cluster_refusal(deadline).await {
                    answer = Ok(Err(refused));
                }
            }
        }
        let e = match answer {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !e.is_timeout() => e,
            // Out of time: the call's bound, or the connection's own (to connect; the cluster
            // connection's response timeout).
            _ => {
                self.timed_out(on);
                return Err(Error::no_answer(self.described.clone()));
            }
        };
        let demoted = read_only(&e);
        let err = map_err(&self.described, e);
        if demoted || matches!(err, Error::Unavailable { .. }) {
            self.replace(on, demoted);
        }
        Err(err)
    }

    /// After a call on connection `generation` found that it could not be made
    /// ([`connection_refused`]): tries one new connection (to the primary the sentinels name,
    /// under Sentinel) before `deadline`, unless another call is trying already; on success the
    /// link takes a new connection. Whether it did (or another call replaced the connection
    /// meanwhile): the call is then worth sending again.
    async fn connect_anew(
        self: &Arc<Self>,
        generation: u64,
        deadline: tokio::time::Instant,
    ) -> bool {
        // The cluster connection makes its nodes' connections itself.
        if self.clustered()
            || self
                .connecting_anew
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return false;
        }
        let _done = Cleared(&self.connecting_anew);
        if self.current.lock().0 != generation {
            return true;
        }
        let attempt = async {
            let client = match &self.origin {
                Origin::Sentinel(sentinels) => sentinels
                    .primary(&self.described, self.timeout)
                    .await
                    .ok()?,
                _ => self.client.lock().clone(),
            };
            // One attempt: the connection manager's own retries would outlast the call.
            let config = ::redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(None);
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok()?;
            Some(client)
        };
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Some(client)) => self.install(
                generation,
                client,
                "a connection could not be made before, and can now",
            ),
            _ => false,
        }
    }

    /// After a call to a cluster found no connection to send on: why, when the nodes refuse
    /// connections ([`crate::stores::redis::cluster::ClusterNodes::refusal`]), checked by one call at a
    /// time before `deadline` (the others answer their own error).
    #[cfg(feature = "redis-cluster")]
    async fn cluster_refusal(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Option<::redis::RedisError> {
        let Origin::Cluster(nodes) = &self.origin else {
            return None;
        };
        if self
            .connecting_anew
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let _done = Cleared(&self.connecting_anew);
        tokio::time::timeout_at(deadline, nodes.refusal(self.timeout))
            .await
            .ok()
            .flatten()
    }

    /// After a call on connection `generation` ran out of time. A server that hangs (stopped, or
    /// behind a partition that drops packets) gives the connection no error to reconnect on, and
    /// calls would run out of time for as long as it hangs, even after a failover had replaced it.
    /// So a new connection is made (at most one a second): through a name that has moved (DNS, a
    /// proxy, a managed endpoint) it reaches the new server; on a cluster it reads the slot map
    /// afresh from the nodes that answer; under Sentinel the sentinels are asked, as on any error.
    fn timed_out(self: &Arc<Self>, generation: u64) {
        if matches!(self.origin, Origin::Sentinel(_)) {
            return self.replace(generation, false);
        }
        if self.current.lock().0 != generation {
            // Replaced already (a call that was in flight on the old connection).
            return;
        }
        {
            let mut last = self.reconnected.lock();
            if last.is_some_and(|t| t.elapsed() < RECONNECT_GAP) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        #[cfg(feature = "redis-cluster")]
        if matches!(self.origin, Origin::Cluster(_)) {
            return self.one_at_a_time(move |link| async move {
                if let Origin::Cluster(nodes) = &link.origin {
                    let (described, timeout) = (&link.described, link.timeout);
                    if let Some(conn) = nodes.reconnect(described, timeout, link.waits).await {
                        link.put(generation, conn, None, "calls ran out of time");
                    }
                }
            });
        }
        let client = self.client.lock().clone();
        self.install(generation, client, "calls ran out of time");
    }

    /// After connection `generation` failed: replaces it if its server was `demoted`, or, under
    /// Sentinel, if the sentinels name another primary (looked up in the background). The
    /// cluster connection follows the failovers it hears of (`MOVED`, `READONLY`, a dropped
    /// connection) itself.
    fn replace(self: &Arc<Self>, generation: u64, demoted: bool) {
        #[cfg(feature = "redis-cluster")]
        if matches!(self.origin, Origin::Cluster(_)) {
            return;
        }
        if !matches!(self.origin, Origin::Sentinel(_)) {
            if demoted {
                let client = self.client.lock().clone();
                self.install(generation, client, "the server is no longer the primary");
            }
            return;
        }
        self.one_at_a_time(move |link| async move {
            let Origin::Sentinel(sentinels) = &link.origin else {
                return;
            };
            match sentinels.primary(&link.described, link.timeout).await {
                Ok(client) if demoted => {
                    link.install(generation, client, "the server is no longer the primary");
                }
                Ok(client) => link.switch_to(generation, client),
                Err(e) => {
                    tracing::warn!(store = %link.described, error = %e, "sentinel lookup failed")
                }
            }
        });
    }

    /// Runs `work` in the background, unless a sentinel lookup or a new cluster connection is
    /// under way already (one at a time).
    fn one_at_a_time<F, Fut>(self: &Arc<Self>, work: F)
    where
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        /// Clears the flag however the work ends (a panic, a runtime shutting down).
        struct Done(Arc<Link>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0
                    .looking_up
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
        }
        if self
            .looking_up
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let done = Done(self.clone());
        tokio::spawn(async move {
            work(done.0.clone()).await;
            drop(done);
        });
    }

    /// Whether the link is to a Redis Cluster.
    fn clustered(&self) -> bool {
        #[cfg(feature = "redis-cluster")]
        if matches!(self.origin, Origin::Cluster(_)) {
            return true;
        }
        false
    }

    /// Moves connection `generation` to `client` (the primary the sentinels name) unless the link
    /// is on that server already.
    fn switch_to(&self, generation: u64, client: ::redis::Client) {
        if client.get_connection_info().addr() != self.client.lock().get_connection_info().addr() {
            self.install(generation, client, "the sentinels name another primary");
        }
    }

    /// Makes `conn` (made from `client`, when that changes too) the link's connection if
    /// `generation` is still current (`why`: for the log). Both change under the connection's
    /// lock, so whoever reads a generation reads its client.
    fn put(&self, generation: u64, conn: Conn, client: Option<::redis::Client>, why: &str) -> bool {
        let mut current = self.current.lock();
        if current.0 != generation {
            return false;
        }
        tracing::warn!(store = %self.described, "{why}; connecting again");
        *current = (generation + 1, conn);
        if let Some(client) = client {
            *self.client.lock() = client;
        }
        true
    }

    /// Makes `client` the link's, with a new connection (made on first use) if `generation` is
    /// still current (`why`: for the log).
    fn install(&self, generation: u64, client: ::redis::Client, why: &str) -> bool {
        if self.current.lock().0 != generation {
            return false;
        }
        match Conn::lazy(&client, &self.config, self.waits) {
            Ok(fresh) => self.put(generation, fresh, Some(client), why),
            Err(e) => {
                tracing::warn!(store = %self.described, error = %e, "cannot replace the connection");
                false
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Origin::Sentinel(sentinels) = &self.origin {
            for task in sentinels.followers.lock().drain(..) {
                task.abort();
            }
        }
    }
}

/// Follows one sentinel's `+switch-master` announcements (`<master> <old ip> <old port> <new ip>
/// <new port>`) for the link's master group, subscribing again whenever the subscription ends, and
/// moves the link to the announced primary at once. Every sentinel has a follower of its own, so a
/// sentinel that is down, or silent behind a partition, does not hide a failover the others
/// announce (the first announcement moves the link; the others find it there). Without them the
/// store would move only when the old primary, demoted, answers `READONLY` — which Sentinel does
/// at its next look at that server, up to ~10 s after the failover, while it still takes writes.
/// `node` makes a data server's client.
async fn follow_switches(
    link: std::sync::Weak<Link>,
    client: ::redis::Client,
    master: String,
    node: NodeClient,
    timeout: Duration,
) {
    loop {
        let subscribed = async {
            let mut pubsub = tokio::time::timeout(timeout, client.get_async_pubsub())
                .await
                .ok()?
                .ok()?;
            tokio::time::timeout(timeout, pubsub.subscribe("+switch-master"))
                .await
                .ok()?
                .ok()?;
            Some(pubsub)
        };
        if let Some(pubsub) = subscribed.await {
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let text: String = msg.get_payload().unwrap_or_default();
                let words: Vec<&str> = text.split(' ').collect();
                let [name, _, _, ip, port] = words[..] else {
                    continue;
                };
                let Ok(port) = port.parse::<u16>() else {
                    continue;
                };
                if name != master {
                    continue;
                }
                let Some(link) = link.upgrade() else { return };
                match node(ip, port) {
                    Ok(client) => {
                        let generation = link.current.lock().0;
                        link.switch_to(generation, client)
                    }
                    Err(e) => {
                        tracing::warn!(store = %link.described, error = %e, "cannot use the announced primary")
                    }
                }
            }
        }
        if link.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One renewal waiting for the batcher.
struct RenewJob {
    record_key: String,
    key: String,
    token: String,
    ttl_ms: u64,
    reply: tokio::sync::oneshot::Sender<Result<RenewOutcome>>,
}

/// The most renewals one script call carries.
const RENEW_BATCH: usize = 1000;

/// How many renewal batches may be in flight at once.
const RENEW_IN_FLIGHT: usize = 8;

/// The renewal scripts: for one server or slot, and for one cluster node.
struct RenewScripts {
    keyed: Lua,
    #[cfg(feature = "redis-cluster")]
    node: Lua,
    /// A node could not load the node script (a server before Redis 7, which knows no script
    /// flags): renewals go by slot from then on.
    #[cfg(feature = "redis-cluster")]
    node_refused: std::sync::atomic::AtomicBool,
}

/// Renews in batches: the renewals queued when a batch leaves go into one script call (at most
/// [`RENEW_BATCH`]), so many leases held by one process cost one round trip per batch, not one
/// per lease. Up to [`RENEW_IN_FLIGHT`] batches are in flight at once (pipelined on the one
/// connection), so 10,000 leases coming due together are renewed in about one round trip.
/// Guards line their renewals up on a shared grid (see the guard), so a process's leases come
/// due together.
fn spawn_renewer(
    link: Arc<Link>,
    scripts: RenewScripts,
) -> tokio::sync::mpsc::UnboundedSender<RenewJob> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<RenewJob>();
    let slots = Arc::new(tokio::sync::Semaphore::new(RENEW_IN_FLIGHT));
    let batcher = Arc::new((link, scripts));
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < RENEW_BATCH {
                match rx.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
            let batcher = batcher.clone();
            tokio::spawn(async move {
                let (link, scripts) = &*batcher;
                renew_batch(link, scripts, batch).await;
                drop(slot);
            });
        }
    });
    tx
}

/// Runs one batch of renewals and answers each job: one script call, or on a cluster one per
/// primary (see [`renew_on_nodes`]).
async fn renew_batch(link: &Arc<Link>, scripts: &RenewScripts, batch: Vec<RenewJob>) {
    #[cfg(feature = "redis-cluster")]
    if let Origin::Cluster(nodes) = &link.origin {
        return renew_on_nodes(link, nodes, scripts, batch).await;
    }
    let left = renew_call(link, &scripts.keyed, batch).await;
    refuse(link, left);
}

/// On a cluster: one call per primary of the slot map, naming no keys, for the records of all
/// the slots it serves (the call's answers are pipelined on the connections to each primary).
/// Records a primary no longer serves (a failover or resharding since the map was read) are
/// renewed by calls naming their keys ([`renew_by_slot`]), which follow the cluster's
/// redirections; so is the whole batch when there is no map or a node refuses the call itself
/// (a server older than Redis 7, out of memory).
#[cfg(feature = "redis-cluster")]
async fn renew_on_nodes(
    link: &Arc<Link>,
    nodes: &crate::stores::redis::cluster::ClusterNodes,
    scripts: &RenewScripts,
    batch: Vec<RenewJob>,
) {
    use std::sync::atomic::Ordering;
    if scripts.node_refused.load(Ordering::Relaxed) {
        let all = batch.into_iter().map(|j| (j, String::new())).collect();
        return renew_by_slot(link, &scripts.keyed, all).await;
    }
    let conn = link.current.lock().1.clone();
    let groups = nodes
        .by_primary(
            &conn,
            batch,
            |j| &j.record_key,
            &link.described,
            link.timeout,
        )
        .await;
    let calls = groups.into_iter().map(|(route, jobs)| async move {
        let left = match route {
            Some(route) => match renew_node_call(link, &scripts.node, route, jobs).await {
                NodeRenewal::Answered(elsewhere) if !elsewhere.is_empty() => {
                    // Found out of date (a failover, a resharding): read again next time.
                    nodes.forget_map();
                    elsewhere
                }
                NodeRenewal::Answered(none) => none,
                NodeRenewal::Refused { jobs, lasting } => {
                    if lasting {
                        tracing::info!(store = %link.described, "the cluster does not take the renewal script for several slots (a server before Redis 7?); renewing by slot");
                        scripts.node_refused.store(true, Ordering::Relaxed);
                    }
                    jobs
                }
            },
            None => jobs.into_iter().map(|j| (j, String::new())).collect(),
        };
        if !left.is_empty() {
            renew_by_slot(link, &scripts.keyed, left).await;
        }
    });
    futures_util::future::join_all(calls).await;
}

/// How a node answered a renewal call for several slots.
#[cfg(feature = "redis-cluster")]
enum NodeRenewal {
    /// It ran: the jobs it answered `elsewhere` (with its error) are left.
    Answered(Vec<(RenewJob, String)>),
    /// It refused the call itself: every job is left; `lasting` when it cannot run the script at
    /// all (it does not compile there), not only now (out of memory, busy).
    Refused {
        jobs: Vec<(RenewJob, String)>,
        lasting: bool,
    },
}

/// Renews `batch` by calls naming their keys: one per slot (a script's keys must share one),
/// all at once.
#[cfg(feature = "redis-cluster")]
async fn renew_by_slot(link: &Arc<Link>, keyed: &Lua, batch: Vec<(RenewJob, String)>) {
    let mut by_slot: HashMap<_, Vec<RenewJob>> = HashMap::new();
    for (j, _) in batch {
        let slot = crate::stores::redis::cluster::slot(&j.record_key);
        by_slot.entry(slot).or_default().push(j);
    }
    let calls = by_slot
        .into_values()
        .map(|g| async move { refuse(link, renew_call(link, keyed, g).await) });
    futures_util::future::join_all(calls).await;
}

/// Answers the renewals a script call naming their keys answered `elsewhere`: the server could
/// not read the record (an ACL denying the key, …).
fn refuse(link: &Link, left: Vec<(RenewJob, String)>) {
    for (j, detail) in left {
        let _ = j.reply.send(Err(Error::Store {
            source: None,
            store: link.described.clone(),
            detail: format!("cannot read the record {}: {detail}", j.record_key),
            retryable: false,
        }));
    }
}

/// The records and arguments of a renewal call for `batch`: the record names, then token, TTL
/// and token as a JSON string per record (as keys or as arguments: the call's `prepare` says).
fn renew_args(call: &mut ScriptCall, batch: &[RenewJob]) {
    for j in batch {
        call.arg(&j.record_key);
    }
    for j in batch {
        call.arg(&j.token).arg(j.ttl_ms).arg(json_str(&j.token));
    }
}

/// The size of a renewal call's keys and arguments, to size its buffer once.
fn renew_bytes(batch: &[RenewJob]) -> usize {
    batch
        .iter()
        .map(|j| j.record_key.len() + 3 * j.token.len() + 24)
        .sum()
}

/// Renews `batch` in one script call naming its keys, answers each job, and returns those the
/// server answered `elsewhere` (with its error).
async fn renew_call(
    link: &Arc<Link>,
    script: &Lua,
    batch: Vec<RenewJob>,
) -> Vec<(RenewJob, String)> {
    let mut call = script.prepare(batch.len(), 3 * batch.len(), renew_bytes(&batch));
    renew_args(&mut call, &batch);
    let call = &call;
    let res: Result<Vec<::redis::Value>> = link
        .send(|mut conn| async move { call.send(&mut conn).await })
        .await;
    match res {
        Ok(values) => answer_renewals(&values, batch),
        Err(e) => {
            fail_renewals(link, &e, batch);
            vec![]
        }
    }
}

/// Renews `batch` in one call of the node script sent to `route` (a slot of the node), answers
/// each job, and says which are left to renew by calls naming their keys: those the node
/// answered `elsewhere`, or all when the node refused the call itself.
#[cfg(feature = "redis-cluster")]
async fn renew_node_call(
    link: &Arc<Link>,
    script: &Lua,
    route: ::redis::cluster_routing::RoutingInfo,
    batch: Vec<RenewJob>,
) -> NodeRenewal {
    let mut call = script.prepare(0, 1 + 4 * batch.len(), renew_bytes(&batch));
    call.arg(batch.len());
    renew_args(&mut call, &batch);
    let (call, route) = (&call, &route);
    let res: Result<Vec<::redis::Value>> = link
        .send(|conn| async move { call.send_routed(conn, route.clone()).await })
        .await;
    match res {
        Ok(values) => NodeRenewal::Answered(answer_renewals(&values, batch)),
        Err(e @ Error::Unavailable { .. }) => {
            fail_renewals(link, &e, batch);
            NodeRenewal::Answered(vec![])
        }
        Err(e) => {
            tracing::debug!(store = %link.described, error = %e, "a node refused the renewal script; renewing by key");
            let text = e.to_string();
            // Redis 6 reads the flags line as Lua ("Error compiling script"); an older 7 may not
            // know the flag.
            let lasting = text.contains("compiling script")
                || text.contains("shebang")
                || text.contains("flag");
            NodeRenewal::Refused {
                jobs: batch.into_iter().map(|j| (j, text.clone())).collect(),
                lasting,
            }
        }
    }
}

/// Answers each job of `batch` from a renewal script's `values` (three per record), and returns
/// the jobs answered `elsewhere`, with the server's error.
fn answer_renewals(values: &[::redis::Value], batch: Vec<RenewJob>) -> Vec<(RenewJob, String)> {
    let mut left = vec![];
    for (i, j) in batch.into_iter().enumerate() {
        let text = |n: usize| -> String {
            values
                .get(3 * i + n)
                .and_then(|x| ::redis::from_redis_value_ref::<String>(x).ok())
                .unwrap_or_default()
        };
        let ok = values
            .get(3 * i)
            .and_then(|x| ::redis::from_redis_value_ref::<i64>(x).ok())
            .unwrap_or(0);
        let out = if ok == 1 {
            serde_json::from_str::<LeaseRecord>(&text(1))
                .map(RenewOutcome::Renewed)
                .map_err(|e| Error::Corrupt {
                    key: j.key.clone(),
                    detail: e.to_string(),
                })
        } else {
            Ok(RenewOutcome::Lost(match text(1).as_str() {
                "elsewhere" => {
                    left.push((j, text(2)));
                    continue;
                }
                "expired" => LostReason::Expired,
                "taken" => LostReason::TakenOver { holder: text(2) },
                _ => LostReason::Released,
            }))
        };
        let _ = j.reply.send(out);
    }
    left
}

/// Answers every job of `batch` with the error `e` of the call that carried it.
fn fail_renewals(link: &Link, e: &Error, batch: Vec<RenewJob>) {
    for j in batch {
        let _ = j.reply.send(Err(shared_error(link, e)));
    }
}

/// The error `e` of a call that carried several callers' operations, for one of them: an
/// [`Error::Unavailable`] as it is (Redlock tells a node that did not answer in time by it),
/// anything else as an [`Error::Store`] with its text and retryability.
fn shared_error(link: &Link, e: &Error) -> Error {
    match e {
        Error::Unavailable {
            store,
            detail,
            source,
        } => Error::Unavailable {
            store: store.clone(),
            detail: detail.clone(),
            source: source.clone(),
        },
        other => Error::Store {
            source: other.source_arc(),
            store: link.described.clone(),
            detail: other.to_string(),
            retryable: other.is_retryable(),
        },
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.link.described)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

/// What a store takes from its options once they are checked ([`checked`]).
pub(crate) struct Checked {
    /// The fence counters' prefix.
    pub(crate) fence_prefix: String,
    /// What grants and renewals wait for ([`RedisOptions::wait`]).
    pub(crate) wait: Option<Wait>,
}

/// `opts` checked before anything connects: the fence prefix against the record prefix
/// ([`checked_fence_prefix`]), and the replicas to wait for ([`RedisOptions::wait`]) for
/// `described`.
pub(crate) fn checked(opts: &RedisOptions, described: &str) -> Result<Checked> {
    let fence_prefix = checked_fence_prefix(opts)?;
    let wait = opts.wait(described)?;
    Ok(Checked { fence_prefix, wait })
}

/// The fence prefix of `opts`, checked against its record prefix: both non-empty, neither a
/// prefix of the other (so no record key can be a counter key).
fn checked_fence_prefix(opts: &RedisOptions) -> Result<String> {
    let fence_prefix = opts.fence_prefix();
    if opts.prefix.is_empty()
        || opts.prefix.starts_with(&fence_prefix)
        || fence_prefix.starts_with(&opts.prefix)
    {
        return Err(Error::option(
            "prefix",
            format!("record prefix {:?} and fence prefix {fence_prefix:?} must be non-empty and neither may start with the other", opts.prefix),
        ));
    }
    Ok(fence_prefix)
}

/// A URL naming several servers, as `redlock://` and `redis+sentinel://` do:
/// `SCHEME://[user:pass@]host1:port1,host2:port2,…[/PATH][?QUERY]`.
pub(crate) struct HostList<'a> {
    /// `user:pass@` as written, or empty.
    pub(crate) userinfo: String,
    /// Each `host:port`, checked to have both.
    pub(crate) hosts: Vec<&'a str>,
    /// What follows the first `/` after the hosts (may be empty).
    pub(crate) path: &'a str,
    /// What follows `?` (may be empty).
    pub(crate) query: &'a str,
}

/// Splits a [`HostList`] URL of `scheme`; `described` (the URL without its password) names it
/// in errors.
pub(crate) fn host_list<'a>(url: &'a str, scheme: &str, described: &str) -> Result<HostList<'a>> {
    let bad = |reason: String| Error::InvalidUrl {
        url: described.to_owned(),
        reason,
    };
    let rest = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .ok_or_else(|| bad(format!("expected {scheme}://host1:port1,host2:port2,…")))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let hosts: Vec<&str> = hosts.split(',').collect();
    for host in &hosts {
        match host.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {}
            _ => return Err(bad(format!("bad server {host:?}: expected host:port"))),
        }
    }
    Ok(HostList {
        userinfo,
        hosts,
        path,
        query,
    })
}

/// A client for `redis://` or `rediss://` (TLS through rustls with the ring provider; the CA from
/// `ca_file` or the system trust store).
fn open_client(url: &str, opts: &RedisOptions, described: &str) -> Result<::redis::Client> {
    let bad = |reason: String| Error::InvalidUrl {
        url: described.to_owned(),
        reason,
    };
    let tls = url.starts_with("rediss://");
    if tls {
        // Several crates may race to install a provider; any installed one will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    if !tls && opts.names_tls_files() {
        return Err(bad("?ca=, ?cert= and ?key= need a rediss:// URL".into()));
    }
    match opts.tls_certificates()? {
        Some(certs) if tls => {
            ::redis::Client::build_with_tls(url, certs).map_err(|e| bad(e.to_string()))
        }
        _ => ::redis::Client::open(url).map_err(|e| bad(e.to_string())),
    }
}

/// Awaits a Redis call for at most `timeout`; a late answer is [`Error::Unavailable`] saying
/// `what` did not come in time.
pub(crate) async fn bounded<T>(
    store: &str,
    timeout: Duration,
    what: &str,
    call: impl std::future::Future<Output = ::redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(r) => r.map_err(|e| map_err(store, e)),
        Err(_) => Err(Error::Unavailable {
            source: None,
            store: store.to_owned(),
            detail: format!("{what} in time"),
        }),
    }
}

/// The holder's token in a [`foreign_record`] (never a token of ours, which are hex).
pub(crate) const FOREIGN_TOKEN: &str = "foreign-value";

/// The expiry shown for a value without a TTL, held until deleted: the last millisecond RFC 3339
/// can write (9999-12-31T23:59:59.999Z).
pub(crate) const NEVER_MS: u64 = 253_402_300_799_999;

/// The lease another client holds on `key` with a value that is not a record of ours (a lock
/// token of redis-py, redsync or redlock-go, or anything else): of Redis type `kind`, `len`
/// bytes long (-1: not a string), expiring in `pttl` ms by the server's clock (-1: never, until
/// it is deleted), read at `now_ms` on the server's clock. Its holder is unknown; leasehold never
/// replaces it.
pub(crate) fn foreign_record(
    key: &str,
    kind: &str,
    len: i64,
    pttl: i64,
    now_ms: u64,
) -> LeaseRecord {
    let what = if len >= 0 {
        format!("a {kind} of {len} bytes")
    } else {
        format!("a Redis {kind}")
    };
    let until = if pttl >= 0 {
        "held until the server expires it"
    } else {
        "no TTL: held until deleted"
    };
    let mut r = LeaseRecord::free(key, 0);
    r.holder = Some(format!("unknown (foreign value: {what}; {until})"));
    r.token = Some(FOREIGN_TOKEN.to_owned());
    r.ttl_ms = u64::try_from(pttl).unwrap_or(0);
    r.expires_ms = match u64::try_from(pttl) {
        Ok(p) => now_ms.saturating_add(p).min(NEVER_MS),
        Err(_) => NEVER_MS,
    };
    r.store.insert("foreign".into(), kind.to_owned());
    r.store.insert("pttl_ms".into(), pttl.to_string());
    r
}

/// A stored value as an inspection: the record, or `None` when it is not a record of ours (see
/// [`RedisStore::foreign_inspection`]).
fn inspection(raw: &[u8]) -> Option<Inspection> {
    let r = serde_json::from_slice::<LeaseRecord>(raw).ok()?;
    Some(Inspection::Record(r))
}

/// Whether a call failed because its connection could not be made, for a reason the connection
/// manager keeps (it connects again only after an I/O error): the server answered something that
/// is not Redis, or refused the credentials. Our calls send no `AUTH`, and a Redis server answers
/// nothing unreadable, so neither comes from a call that reached a server.
pub(crate) fn connection_refused(e: &::redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ::redis::ErrorKind::Parse | ::redis::ErrorKind::AuthenticationFailed
    )
}

/// Whether the server refused a write as a replica (`READONLY`).
fn read_only(e: &::redis::RedisError) -> bool {
    e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::ReadOnly)
}

pub(crate) fn map_err(store: &str, e: ::redis::RedisError) -> Error {
    classify(store, &e).caused_by(e)
}

/// The [`Error`] a Redis error means (see [`map_err`]), without its source.
fn classify(store: &str, e: &::redis::RedisError) -> Error {
    let text = e.to_string();
    if e.kind() == ::redis::ErrorKind::Client && text.contains(NOT_REPLICATED) {
        // A replica missing or lagging: passing, as a full server's refusal is.
        return Error::Store {
            source: None,
            store: store.to_owned(),
            detail: format!("{NOT_REPLICATED}: {}", e.detail().unwrap_or_default()),
            retryable: true,
        };
    }
    if read_only(e) {
        // A failover demoted the server; the store connects again (see `Link`).
        return Error::Unavailable {
            source: None,
            store: store.to_owned(),
            detail: format!(
                "the server is a read-only replica now (a failover?); connecting again: {text}"
            ),
        };
    }
    // A TLS trust failure or refused credentials do not heal by retrying (the cluster client
    // reports the latter inside an I/O error: "Failed to create initial connections").
    if text.to_ascii_lowercase().contains("certificate")
        || e.kind() == ::redis::ErrorKind::AuthenticationFailed
        || text.contains("AuthenticationFailed")
    {
        return Error::Store {
            source: None,
            store: store.to_owned(),
            detail: text,
            retryable: false,
        };
    }
    if e.kind() == ::redis::ErrorKind::Parse {
        return Error::Store {
            source: None,
            store: store.to_owned(),
            detail: format!(
                "the server answered something that is not Redis (a wrong port, or a proxy or another service in the way?): {}",
                text.lines().next().unwrap_or_default()
            ),
            retryable: false,
        };
    }
    // A cluster in motion (a failover, a resharding): the connection retried its redirections
    // and they still lead nowhere live; the slot is served again once a replica takes over.
    let cluster_moving = matches!(
        e.kind(),
        ::redis::ErrorKind::Server(
            ::redis::ServerErrorKind::Moved
                | ::redis::ServerErrorKind::Ask
                | ::redis::ServerErrorKind::ClusterDown
        ) | ::redis::ErrorKind::ClusterConnectionNotFound
    );
    if cluster_moving
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
    {
        Error::Unavailable {
            source: None,
            store: store.to_owned(),
            detail: e.to_string(),
        }
    } else {
        // Passing conditions of the server: loading its data, out of memory (`maxmemory` with
        // `noeviction` refuses writes until keys expire or are deleted), busy running a script,
        // unable to persist (`MISCONF`), full of clients. A holder keeps renewing through them until
        // its lease could have expired; a waiter keeps waiting.
        let retryable = matches!(
            e.kind(),
            ::redis::ErrorKind::Server(::redis::ServerErrorKind::BusyLoading)
                | ::redis::ErrorKind::Server(::redis::ServerErrorKind::TryAgain)
                | ::redis::ErrorKind::Server(::redis::ServerErrorKind::MasterDown)
        ) || matches!(
            e.code(),
            // NOREPLICAS: fewer replicas than the server's `min-replicas-to-write` are in touch.
            Some("OOM" | "BUSY" | "MISCONF" | "NOREPLICAS")
        ) || text.contains("max number of clients reached");
        Error::Store {
            source: None,
            store: store.to_owned(),
            detail: e.to_string(),
            retryable,
        }
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://…`).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`], [`Error::InvalidOption`] for colliding prefixes, or
    /// [`Error::Unavailable`] when the server cannot be reached.
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use leasehold::stores::redis::{RedisOptions, RedisStore};
    /// use std::time::Duration;
    /// // The seed deployments' prefix; a server that stops answering fails calls after 1 s.
    /// let opts = RedisOptions {
    ///     prefix: "agent:lock:".into(),
    ///     timeout: Duration::from_secs(1),
    ///     ..RedisOptions::default()
    /// };
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/0", opts).await?;
    /// let locks = leasehold::Locks::new(store);
    /// # let _ = locks; Ok(()) }
    /// ```
    pub async fn connect(url: &str, opts: RedisOptions) -> Result<Self> {
        Self::connect_inner(url, opts, false).await
    }

    /// Like [`connect`](Self::connect), but connects on first use (Redlock nodes may be down at
    /// start).
    pub(crate) async fn connect_inner(url: &str, opts: RedisOptions, lazy: bool) -> Result<Self> {
        let described = crate::redact_url(url);
        let checked = checked(&opts, &described)?;
        let client = open_client(url, &opts, &described)?;
        Self::start(client, Origin::Fixed, described, checked, opts, lazy).await
    }

    /// Connects to the primary that the sentinels at `sentinels` (`scheme://host:port` each,
    /// `scheme` `rediss` for TLS, else `redis`) name for `master`; `userinfo` (`user:pass@` or
    /// empty) and `db` are the data servers', which are spoken to with the same scheme.
    async fn connect_sentinel(
        (scheme, sentinels): (&'static str, Vec<String>),
        master: String,
        (userinfo, db): (String, String),
        described: String,
        opts: RedisOptions,
    ) -> Result<Self> {
        let checked = checked(&opts, &described)?;
        let sentinels = sentinels
            .iter()
            .map(|url| open_client(url, &opts, &described))
            .collect::<Result<Vec<_>>>()?;
        // A data server's client from its address, with our database and credentials (decoded as
        // the redis crate decodes any URL) and the sentinels' TLS settings.
        let node_opts = opts.clone();
        let node_described = described.clone();
        let node: NodeClient = Arc::new(move |ip: &str, port: u16| {
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_owned()
            };
            let url = format!("{scheme}://{userinfo}{host}:{port}/{db}");
            open_client(&url, &node_opts, &node_described)
        });
        // Bad credentials or database: refused now, not at the first lookup.
        node("127.0.0.1", 1)?;
        let named = Sentinels {
            sentinels: sentinels.clone(),
            master: master.clone(),
            node: node.clone(),
            followers: Mutex::new(vec![]),
        };
        let client = named.primary(&described, opts.timeout * 2).await?;
        let timeout = opts.timeout;
        let origin = Origin::Sentinel(named);
        let store = Self::start(client, origin, described, checked, opts, false).await?;
        let link = &store.inner.link;
        if let Origin::Sentinel(Sentinels { followers, .. }) = &link.origin {
            for sentinel in sentinels {
                let task = tokio::spawn(follow_switches(
                    Arc::downgrade(link),
                    sentinel,
                    master.clone(),
                    node.clone(),
                    timeout,
                ));
                followers.lock().push(task.abort_handle());
            }
        }
        Ok(store)
    }

    async fn start(
        client: ::redis::Client,
        origin: Origin,
        described: String,
        checked: Checked,
        opts: RedisOptions,
        lazy: bool,
    ) -> Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.timeout))
            // Every call is bounded by `bounded` (one timer per call, not two).
            .set_response_timeout(None)
            // A lone server's calls wait out a short restart through the connection's retries; a
            // Redlock node's (connected lazily) fail at once, so that the calls it is one of go
            // on with the other nodes, and its next call connects again.
            .set_number_of_retries(if lazy { 0 } else { 2 })
            .set_max_delay(Duration::from_millis(500));
        let waits = checked.wait.is_some();
        let conn = if lazy {
            Conn::lazy(&client, &config, waits).map_err(|e| map_err(&described, e))?
        } else {
            let calls = bounded(
                &described,
                opts.timeout * 2,
                "no connection",
                ConnectionManager::new_with_config(client.clone(), config.clone()),
            )
            .await?;
            let waits = waits
                .then(|| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
                .transpose()
                .map_err(|e| map_err(&described, e))?;
            Conn::One(calls, waits)
        };
        Ok(Self::assemble(
            conn, client, origin, config, described, checked, opts,
        ))
    }

    /// The store over connection `conn`, made from `client` (pub/sub connections are made from it
    /// too), with the options `checked` took from `opts`.
    pub(crate) fn assemble(
        conn: Conn,
        client: ::redis::Client,
        origin: Origin,
        config: ConnectionManagerConfig,
        described: String,
        checked: Checked,
        opts: RedisOptions,
    ) -> Self {
        let Checked { fence_prefix, wait } = checked;
        let scripts = Scripts::new(wait);
        let link = Arc::new(Link {
            origin,
            config,
            described,
            timeout: opts.timeout,
            current: Mutex::new((0, conn)),
            waits: wait.is_some(),
            client: Mutex::new(client),
            looking_up: Default::default(),
            connecting_anew: Default::default(),
            reconnected: Mutex::new(None),
            lanes: Default::default(),
        });
        let renewals = spawn_renewer(
            link.clone(),
            RenewScripts {
                keyed: scripts.renew.clone(),
                #[cfg(feature = "redis-cluster")]
                node: scripts.renew_node.clone(),
                #[cfg(feature = "redis-cluster")]
                node_refused: Default::default(),
            },
        );
        RedisStore {
            inner: Arc::new(Inner {
                link,
                scripts,
                prefix: opts.prefix,
                fence_prefix,
                hub: tokio::sync::Mutex::new(None),
                renewals,
            }),
        }
    }

    /// Parses `redis+sentinel://[user:pass@]host1:port1,host2:port2,…/MASTER[/DB][?prefix=…]` (or
    /// `rediss+sentinel://…[?ca=…]`: TLS to sentinels and data servers alike) and connects to the
    /// primary the sentinels name for `MASTER`. The user and password are the data servers';
    /// `?sentinel_pass=…[&sentinel_user=…]` are the sentinels' (none by default).
    pub(crate) async fn from_sentinel_url(url: &str) -> Result<Self> {
        let described = crate::redact_url(url);
        let bad = |reason: &str| Error::InvalidUrl {
            url: described.clone(),
            reason: reason.into(),
        };
        // The sentinels' and data servers' scheme: TLS for all, or for none.
        let (scheme, sentinel) = if url.starts_with("rediss+sentinel://") {
            ("rediss+sentinel", "rediss")
        } else {
            ("redis+sentinel", "redis")
        };
        let list = host_list(url, scheme, &described)?;
        let (master, db) = match list.path.split_once('/') {
            Some((m, d)) => (m, d),
            None => (list.path, ""),
        };
        if master.is_empty() {
            return Err(bad("expected the master group's name after the sentinels, as in redis+sentinel://h1:26379,h2:26379/mymaster/0"));
        }
        // `sentinel_user` and `sentinel_pass` are the sentinels' credentials; the rest are ours.
        let pairs: Vec<_> = url::form_urlencoded::parse(list.query.as_bytes()).collect();
        let theirs = |k: &str| matches!(k, "sentinel_user" | "sentinel_pass");
        let param = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let mut sentinels = vec![];
        for host in &list.hosts {
            let mut u = url::Url::parse(&format!("{sentinel}://{host}"))
                .map_err(|e| bad(&e.to_string()))?;
            if let Some(pass) = param("sentinel_pass") {
                let user = param("sentinel_user").map_or("", |u| u.as_ref());
                // Setting credentials fails only for URLs without a host, which these have.
                let _ = u.set_username(user);
                let _ = u.set_password(Some(pass));
            }
            sentinels.push(u.to_string());
        }
        let ours = pairs.iter().filter(|(k, _)| !theirs(k)).cloned();
        let opts = RedisOptions::from_query(url, ours, RedisOptions::default())?;
        let (master, node) = (master.to_owned(), (list.userinfo, db.to_owned()));
        Self::connect_sentinel((sentinel, sentinels), master, node, described, opts).await
    }

    /// Parses `redis://…?prefix=…&fence_prefix=…&timeout=2s` (or `rediss://…`, or
    /// `redis+unix:///path/to/socket?db=…&user=…&pass=…&prefix=…`) and connects.
    pub(crate) async fn from_url(url: &url::Url) -> Result<Self> {
        // A Unix socket URL has no host for credentials or path for the database: the redis crate
        // reads them from these parameters, which stay in the URL it gets.
        let unix = url.scheme() == "redis+unix";
        let theirs = |k: &str| unix && matches!(k, "db" | "user" | "pass");
        let mut clean = url.clone();
        clean.set_query(None);
        let passed: Vec<_> = url.query_pairs().filter(|(k, _)| theirs(k)).collect();
        if !passed.is_empty() {
            clean.query_pairs_mut().extend_pairs(passed);
        }
        let ours = url.query_pairs().filter(|(k, _)| !theirs(k));
        let opts = RedisOptions::from_query(url.as_str(), ours, RedisOptions::default())?;
        Self::connect(clean.as_str(), opts).await
    }

    fn record_key(&self, key: &Key) -> String {
        self.name(&self.inner.prefix, key)
    }

    /// The key a record key `name` (found by a scan) is of: `name` without the prefix (and, on a
    /// cluster, the hash tag's braces).
    fn key_of(&self, name: &str) -> String {
        let key = name
            .strip_prefix(self.inner.prefix.as_str())
            .unwrap_or(name);
        if self.clustered() {
            if let Some(k) = key.strip_prefix('{').and_then(|k| k.strip_suffix('}')) {
                return k.to_owned();
            }
        }
        key.to_owned()
    }

    /// The inspection of record key `name` (of `key`) holding a value that is not a record of
    /// ours: another client's lock ([`foreign_record`]), from its type, length and PTTL and the
    /// server's time, read in one round trip; `None` when it is gone.
    async fn foreign_inspection(&self, key: &str, name: &str) -> Result<Option<Inspection>> {
        let mut pipe = ::redis::pipe();
        pipe.cmd("TYPE").arg(name).cmd("PTTL").arg(name).cmd("TIME");
        let pipe = &pipe;
        let (kind, pttl, (secs, micros)): (String, i64, (u64, u64)) = self
            .inner
            .link
            .send(|mut conn| async move { pipe.query_async(&mut conn).await })
            .await?;
        if kind == "none" || pttl == -2 {
            return Ok(None);
        }
        let len = if kind == "string" {
            self.query(::redis::cmd("STRLEN").arg(name)).await?
        } else {
            -1
        };
        let now = secs * 1000 + micros / 1000;
        Ok(Some(Inspection::Record(foreign_record(
            key, &kind, len, pttl, now,
        ))))
    }

    fn fence_key(&self, key: &Key) -> String {
        self.name(&self.inner.fence_prefix, key)
    }

    /// The Redis key of `key` under `prefix`: on a cluster with the key as the hash tag, so that
    /// record and counter share a slot (see `redis_cluster`).
    fn name(&self, prefix: &str, key: &Key) -> String {
        if self.clustered() {
            return format!("{prefix}{{{}}}", key.as_str());
        }
        format!("{prefix}{}", key.as_str())
    }

    /// Whether the store is on a Redis Cluster.
    fn clustered(&self) -> bool {
        self.inner.link.clustered()
    }

    /// Refuses a key the store cannot name (on a cluster: one starting with `}`).
    fn check(&self, key: &Key) -> Result<()> {
        #[cfg(feature = "redis-cluster")]
        if self.clustered() {
            return crate::stores::redis::cluster::check_key(key);
        }
        let _ = key;
        Ok(())
    }

    /// Sends a plain command, bounded by the store's timeout.
    async fn query<T: ::redis::FromRedisValue>(&self, cmd: &::redis::Cmd) -> Result<T> {
        self.inner
            .link
            .send(|mut conn| async move { cmd.query_async(&mut conn).await })
            .await
    }

    /// Sends a script call, bounded by the store's timeout; the acquire and release scripts'
    /// calls are coalesced while the server (on a cluster, the primary) is busy ([`coalesce`]).
    pub(crate) async fn call<T: ::redis::FromRedisValue>(&self, call: &ScriptCall) -> Result<T> {
        let link = &self.inner.link;
        let Some(batched) = call.lua.batched() else {
            return link
                .send(|mut conn| async move { call.send(&mut conn).await })
                .await;
        };
        let answer = match &link.origin {
            #[cfg(feature = "redis-cluster")]
            Origin::Cluster(nodes) => coalesce::send_to_primary(link, nodes, batched, call).await?,
            _ => coalesce::send(link, batched, call).await?,
        };
        ::redis::from_redis_value(answer).map_err(|e| map_err(&link.described, e.into()))
    }

    /// A call of `script` (one of ours that takes one key) on `key` with `args`.
    fn one_key(script: &Lua, key: String, args: &[&str]) -> ScriptCall {
        let bytes = key.len() + args.iter().map(|a| a.len()).sum::<usize>();
        let mut call = script.prepare(1, args.len(), bytes);
        call.arg(key);
        for a in args {
            call.arg(*a);
        }
        call
    }

    /// Asks the server for `PING`, bounded by the store's timeout: whether it answers at all.
    #[cfg(feature = "redlock")]
    pub(crate) async fn ping(&self) -> Result<()> {
        let _: String = self.query(&::redis::cmd("PING")).await?;
        Ok(())
    }

    /// Raises the fence counter of `key` to at least `floor`.
    #[cfg(feature = "redlock")]
    pub(crate) async fn raise_fence(&self, key: &Key, floor: u64) -> Result<()> {
        let floor = floor.to_string();
        let call = Self::one_key(
            &self.inner.scripts.raise_fence,
            self.fence_key(key),
            &[&floor],
        );
        let _: i64 = self.call(&call).await?;
        Ok(())
    }

    /// The acquire script call for `req`. It names no node: Redlock sends one call to every node
    /// (their prefixes are the same).
    pub(crate) fn acquire_call(&self, req: &AcquireRequest) -> ScriptCall {
        let (record_key, fence_key) = (self.record_key(&req.key), self.fence_key(&req.key));
        // The record around the fence and times the script adds, in the fields' order.
        let mut head = Vec::with_capacity(64 + 2 * req.key.as_str().len() + req.holder.len());
        head.extend_from_slice(b"{\"key\":");
        json_push(&mut head, req.key.as_str());
        head.extend_from_slice(b",\"holder\":");
        json_push(&mut head, &req.holder);
        head.extend_from_slice(b",\"token\":");
        json_push(&mut head, &req.token);
        head.extend_from_slice(b",\"fence\":");
        let ttl_ms = req.ttl.as_millis() as u64;
        let mut tail = format!(
            ",\"ttl_ms\":{ttl_ms},\"waiter\":null,\"waiter_token\":null,\"waiter_expires\":null,\"pid\":{},\"host\":",
            crate::decide::pid()
        )
        .into_bytes();
        json_push(&mut tail, crate::decide::host());
        tail.extend_from_slice(b",\"labels\":");
        let mark = tail.len();
        if serde_json::to_writer(&mut tail, &req.labels).is_err() {
            tail.truncate(mark);
            tail.extend_from_slice(b"{}");
        }
        tail.push(b'}');
        let waiter_ms = req.waiter_ttl.map_or(0, |d| d.as_millis().max(1) as u64);
        let bytes = record_key.len() + fence_key.len() + head.len() + tail.len() + 48;
        let mut call = self.inner.scripts.acquire.prepare(2, 6, bytes);
        call.arg(record_key)
            .arg(fence_key)
            .arg(head)
            .arg(tail)
            .arg(ttl_ms)
            .arg(req.fences.max(1))
            .arg(waiter_ms)
            .arg(u8::from(req.watching));
        call
    }

    /// Reads the acquire script's answer to the call for `req`.
    pub(crate) fn acquire_answer(
        &self,
        req: &AcquireRequest,
        answer: ::redis::Value,
    ) -> Result<AcquireOutcome> {
        let key = req.key.as_str();
        let (granted, raw) = match answer {
            ::redis::Value::BulkString(fast) => {
                // A free key granted: the record is the one we sent, with this fence and time.
                let text = std::str::from_utf8(&fast).unwrap_or_default();
                let mut parts = text.split(' ').map(str::parse::<u64>);
                let (Some(Ok(fence)), Some(Ok(now))) = (parts.next(), parts.next()) else {
                    return Err(self.garbage(key, text));
                };
                let mut rec = LeaseRecord::free(key, 0);
                crate::decide::grant(&mut rec, req, fence, now);
                return Ok(AcquireOutcome::Granted(rec));
            }
            ::redis::Value::Array(a) if a.first() == Some(&::redis::Value::Int(2)) => {
                // A value that is not a record of ours: another client's lock.
                let foreign = ::redis::from_redis_value::<(i64, String, i64, u64, i64)>(
                    ::redis::Value::Array(a),
                )
                .map_err(|e| self.garbage(key, &e.to_string()))?;
                let (_, kind, pttl, now, len) = foreign;
                return Ok(AcquireOutcome::Held(foreign_record(
                    key, &kind, len, pttl, now,
                )));
            }
            other => ::redis::from_redis_value::<(i64, Option<Vec<u8>>)>(other)
                .map_err(|e| self.garbage(key, &e.to_string()))?,
        };
        let raw = raw.unwrap_or_default();
        if granted == 1 {
            return Ok(AcquireOutcome::Granted(self.parse(key, &raw)?));
        }
        let rec = match self.parse(key, &raw) {
            Ok(r) => r,
            // Held by something we cannot read: report it as held by an unknown holder.
            Err(_) => {
                let mut r = LeaseRecord::free(key, 0);
                r.holder = Some("(unreadable record)".into());
                r
            }
        };
        Ok(AcquireOutcome::Held(rec))
    }

    /// An answer no version of our scripts gives.
    fn garbage(&self, key: &str, detail: &str) -> Error {
        Error::Store {
            source: None,
            store: self.inner.link.described.clone(),
            detail: format!("unexpected answer to the acquire script for {key:?}: {detail}"),
            retryable: false,
        }
    }

    /// The release script call for `token` on `key` (the same for every Redlock node).
    pub(crate) fn release_call(&self, key: &Key, token: &str) -> ScriptCall {
        let script = &self.inner.scripts.release;
        Self::one_key(script, self.record_key(key), &[token, &json_str(token)])
    }

    /// The release script's answer as an outcome.
    pub(crate) fn release_answer(answer: i64) -> ReleaseOutcome {
        if answer == 1 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        }
    }

    fn parse(&self, key: &str, raw: &[u8]) -> Result<LeaseRecord> {
        serde_json::from_slice(raw).map_err(|e| Error::Corrupt {
            key: key.to_owned(),
            detail: e.to_string(),
        })
    }

    /// The pub/sub hub that hears the releases of `key`: the store's one (on a cluster, the one of
    /// the primary serving the key's slot).
    async fn hub(&self, key: &Key) -> Result<Arc<Hub>> {
        let link = &self.inner.link;
        #[cfg(feature = "redis-cluster")]
        if let Origin::Cluster(nodes) = &link.origin {
            let conn = link.current.lock().1.clone();
            let name = self.record_key(key);
            return nodes
                .hub_for(
                    &conn,
                    &name,
                    &self.inner.prefix,
                    &link.described,
                    link.timeout,
                )
                .await;
        }
        let _ = key;
        let mut slot = self.inner.hub.lock().await;
        // A hub on the server the link left (a failover) no longer hears releases; new
        // subscriptions go to the link's server (older ones keep theirs, with the fallback timer).
        let generation = link.current.lock().0;
        if let Some((h, made_for)) = slot.as_ref() {
            if !h.dead() && *made_for == generation {
                return Ok(h.clone());
            }
        }
        let client = link.client.lock().clone();
        let hub = Hub::start(&client, &self.inner.prefix, &link.described, link.timeout).await?;
        *slot = Some((hub.clone(), generation));
        Ok(hub)
    }
}

/// How often a hub with subscriptions checks that its server still answers (an `UNSUBSCRIBE` of a
/// channel no record has, on its connection, bounded by the store's timeout).
const HUB_CHECK: Duration = Duration::from_secs(1);

/// One pub/sub connection per store (per node on a cluster), fanning messages out to per-channel
/// watch channels.
///
/// A connection that ends (the server closed it) or stops answering (a server that hangs, such as
/// an old primary after a failover, keeps its connection open and silent) ends the hub: its
/// subscriptions turn stale ([`ChangeWatch::stale`]) and are woken, and their waiters subscribe
/// again, through a new hub on the server the store now uses.
pub(crate) struct Hub {
    sink: PubSubSink,
    subs: Subs,
    alive: watch::Receiver<bool>,
    /// The store's per-call timeout, which bounds waiting for a subscription's confirmation.
    timeout: Duration,
}

/// Each channel's watch sender and how many subscriptions share it.
type SubMap = Mutex<HashMap<String, (watch::Sender<()>, usize)>>;
type Subs = Arc<SubMap>;

impl Hub {
    /// A hub on `client`'s server, its connection checked with `probe`, a channel no record has
    /// (the record prefix: keys are never empty).
    pub(crate) async fn start(
        client: &::redis::Client,
        probe: &str,
        store: &str,
        timeout: Duration,
    ) -> Result<Arc<Hub>> {
        let pubsub = bounded(
            store,
            timeout,
            "no pub/sub connection",
            client.get_async_pubsub(),
        )
        .await?;
        let (sink, mut stream) = pubsub.split();
        let subs: Subs = Arc::default();
        let (alive_tx, alive) = watch::channel(true);
        let alive_tx = Arc::new(alive_tx);
        // The reader and the check hold the subscriptions weakly: once the hub and every
        // subscription are dropped, the check ends, the connection's last sink goes, and so does
        // the reader.
        let (fan, ended) = (Arc::downgrade(&subs), alive_tx.clone());
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Some(subs) = fan.upgrade() else {
                    break;
                };
                let map = subs.lock();
                if let Some((tx, _)) = map.get(msg.get_channel_name()) {
                    tx.send_replace(());
                }
            }
            hub_ended(&ended, &fan);
        });
        tokio::spawn(check(
            sink.clone(),
            Arc::downgrade(&subs),
            alive_tx,
            reader.abort_handle(),
            probe.to_owned(),
            store.to_owned(),
            timeout,
        ));
        Ok(Arc::new(Hub {
            sink,
            subs,
            alive,
            timeout,
        }))
    }

    pub(crate) fn dead(&self) -> bool {
        !*self.alive.borrow()
    }

    async fn subscribe(self: &Arc<Self>, channel: String, store: &str) -> Result<RedisWatch> {
        let (rx, first) = {
            let mut map = self.subs.lock();
            let entry = map
                .entry(channel.clone())
                .or_insert_with(|| (watch::Sender::new(()), 0));
            entry.1 += 1;
            (entry.0.subscribe(), entry.1 == 1)
        };
        let (mut sink, subs) = (self.sink.clone(), self.subs.clone());
        let w = RedisWatch {
            rx,
            subs,
            channel: channel.clone(),
            sink: sink.clone(),
            alive: self.alive.clone(),
        };
        if first {
            // Confirmed by the server before we return: no release published after this is missed.
            // Bounded like every call: a server that stopped answering must not hold a waiter
            // past its wait limit.
            bounded(
                store,
                self.timeout,
                "no subscription confirmation",
                sink.subscribe(&channel),
            )
            .await?;
        }
        Ok(w)
    }
}

/// Marks a hub ended and wakes its subscriptions: their waiters look at the store again and,
/// seeing them stale, subscribe again.
fn hub_ended(alive: &watch::Sender<bool>, subs: &Weak<SubMap>) {
    alive.send_replace(false);
    if let Some(subs) = subs.upgrade() {
        for (tx, _) in subs.lock().values() {
            tx.send_replace(());
        }
    }
}

/// Every [`HUB_CHECK`] while a hub has subscriptions, sends `UNSUBSCRIBE probe` on its connection
/// (a subscribed RESP2 connection takes few commands: `PING` would do, but the least ACL a
/// deployment grants — see the README — has no `PING`, and a refusal every second would fill the
/// ACL log). A connection that gives no answer within `timeout`, or fails, ends the hub (and its
/// reader, which a silent connection would keep waiting); any answer, an error too, is life. Ends
/// with the hub, or once nothing refers to its subscriptions.
async fn check(
    mut sink: PubSubSink,
    subs: Weak<SubMap>,
    alive: Arc<watch::Sender<bool>>,
    reader: tokio::task::AbortHandle,
    probe: String,
    store: String,
    timeout: Duration,
) {
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + HUB_CHECK, HUB_CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if !*alive.borrow() {
            return;
        }
        match subs.upgrade() {
            None => return,
            Some(s) if s.lock().is_empty() => continue,
            Some(_) => {}
        }
        let answered = tokio::time::timeout(timeout, sink.unsubscribe(&probe)).await;
        let alive_now = match answered {
            Ok(Ok(())) => true,
            Ok(Err(e)) => !(e.is_io_error() || e.is_connection_dropped()),
            Err(_) => false,
        };
        if !alive_now {
            tracing::warn!(store = %store, "the pub/sub connection does not answer; its waiters subscribe again");
            reader.abort();
            hub_ended(&alive, &subs);
            return;
        }
    }
}

/// A pub/sub subscription to one record's channel.
struct RedisWatch {
    rx: watch::Receiver<()>,
    subs: Subs,
    channel: String,
    sink: PubSubSink,
    /// The hub's liveness: a subscription of an ended hub hears nothing more.
    alive: watch::Receiver<bool>,
}

impl std::fmt::Debug for RedisWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisWatch")
            .field("channel", &self.channel)
            .finish()
    }
}

#[async_trait]
impl ChangeWatch for RedisWatch {
    async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn stale(&self) -> bool {
        !*self.alive.borrow()
    }
}

impl Drop for RedisWatch {
    fn drop(&mut self) {
        let last = {
            let mut map = self.subs.lock();
            match map.get_mut(&self.channel) {
                Some(e) => {
                    e.1 -= 1;
                    if e.1 == 0 {
                        map.remove(&self.channel);
                        true
                    } else {
                        false
                    }
                }
                None => false,
            }
        };
        if last {
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                let mut sink = self.sink.clone();
                let channel = std::mem::take(&mut self.channel);
                h.spawn(async move {
                    let _ = sink.unsubscribe(&channel).await;
                });
            }
        }
    }
}

#[async_trait]
impl LockStore for RedisStore {
    fn describe(&self) -> String {
        self.inner.link.described.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: true,
            watch: true,
            liveness: false,
            fence_source: "INCR of a per-key counter key in the acquire script",
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.check(&req.key)?;
        let call = self.acquire_call(req);
        let answer = match self.call(&call).await {
            Err(e) if call.lua.0.wait.is_some() => {
                // A grant the replicas may lack is not handed out: let go of it, if it was one
                // (too few acknowledged it, `WAIT` was refused, or the answer was lost). The
                // release is the owner's only, so another's lease or a waiter's entry is kept.
                if let Err(r) = self.release(&req.key, &req.token).await {
                    tracing::debug!(store = %self.inner.link.described, key = %req.key.as_str(), error = %r, "could not release an unreplicated grant; it expires by its TTL");
                }
                return Err(e);
            }
            answer => answer?,
        };
        self.acquire_answer(req, answer)
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        self.check(key)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = RenewJob {
            record_key: self.record_key(key),
            key: key.as_str().to_owned(),
            token: token.to_owned(),
            ttl_ms: ttl.as_millis() as u64,
            reply,
        };
        let gone = || Error::Unavailable {
            source: None,
            store: self.inner.link.described.clone(),
            detail: "the renewal batcher stopped (runtime shutting down)".into(),
        };
        self.inner.renewals.send(job).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        self.check(key)?;
        let answer = self.call(&self.release_call(key, token)).await?;
        Ok(Self::release_answer(answer))
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        self.check(key)?;
        let script = &self.inner.scripts.withdraw;
        let _: i64 = self
            .call(&Self::one_key(script, self.record_key(key), &[token]))
            .await?;
        Ok(())
    }

    async fn notify_release(&self, key: &Key, fence: Option<u64>) -> Result<bool> {
        self.check(key)?;
        let script = &self.inner.scripts.mark_watched;
        let fence = fence.map(|f| f.to_string()).unwrap_or_default();
        let marked: i64 = self
            .call(&Self::one_key(script, self.record_key(key), &[&fence]))
            .await?;
        Ok(marked == 1)
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        self.check(key)?;
        let name = self.record_key(key);
        let get = &::redis::cmd("GET").arg(&name).clone();
        let read: std::result::Result<Option<Vec<u8>>, String> = self
            .inner
            .link
            .send(|mut conn| async move {
                match get.query_async(&mut conn).await {
                    // An operator's hash, list, … where the record lives.
                    Err(e) if e.code() == Some("WRONGTYPE") => Ok(Err(e.to_string())),
                    r => r.map(Ok),
                }
            })
            .await?;
        match read {
            Ok(None) => Ok(None),
            Ok(Some(raw)) => match inspection(&raw) {
                Some(i) => Ok(Some(i)),
                None => self.foreign_inspection(key.as_str(), &name).await,
            },
            Err(_) => self.foreign_inspection(key.as_str(), &name).await,
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        // On a cluster the key follows `{`, its hash tag's opening.
        let tag = if self.clustered() { "{" } else { "" };
        let pattern = format!(
            "{}{tag}{}*",
            glob_escape(&self.inner.prefix),
            glob_escape(prefix)
        );
        let link = &self.inner.link;
        let conn = link.current.lock().1.clone();
        let mut names = match &conn {
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c, _) => {
                crate::stores::redis::cluster::scan_all(c, &pattern, &link.described, link.timeout)
                    .await?
            }
            Conn::One(..) => scan(&pattern, |page| async move { self.query(&page).await }).await?,
        };
        names.sort();
        names.dedup();
        let mut out = vec![];
        for chunk in names.chunks(500) {
            let raws: Vec<Option<Vec<u8>>> = self.query(::redis::cmd("MGET").arg(chunk)).await?;
            for (name, raw) in chunk.iter().zip(raws) {
                if let Some(i) = raw.as_deref().and_then(inspection) {
                    out.push(i);
                    continue;
                }
                // Another client's value, expired since the scan, or a value of another type
                // (`MGET` reads neither of the last two).
                let key = self.key_of(name);
                if let Some(i) = self.foreign_inspection(&key, name).await? {
                    out.push(i);
                }
            }
        }
        Ok(out)
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        self.check(key)?;
        let script = &self.inner.scripts.force;
        let raw: Option<Vec<u8>> = self
            .call(&Self::one_key(script, self.record_key(key), &[]))
            .await?;
        Ok(raw.and_then(|raw| serde_json::from_slice(&raw).ok()))
    }

    async fn cleanup(&self, _older_than: Duration) -> Result<CleanupReport> {
        // Records expire on the server by themselves; fence counters are never removed, since
        // removing one would let the key's fence go backwards.
        Ok(CleanupReport::default())
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        self.check(key)?;
        let hub = self.hub(key).await?;
        Ok(Some(Box::new(
            hub.subscribe(self.record_key(key), &self.inner.link.described)
                .await?,
        )))
    }
}

/// The keys matching `pattern`: `SCAN` page by page, each page's command sent by `send`.
pub(crate) async fn scan<F, Fut>(pattern: &str, mut send: F) -> Result<Vec<String>>
where
    F: FnMut(::redis::Cmd) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, Vec<String>)>>,
{
    let mut names = vec![];
    let mut cursor: u64 = 0;
    loop {
        let mut page = ::redis::cmd("SCAN");
        page.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, batch) = send(page).await?;
        names.extend(batch);
        cursor = next;
        if cursor == 0 {
            return Ok(names);
        }
    }
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Appends `s` as a JSON string (writing into a `Vec` cannot fail, nor can serialising a `str`).
fn json_push(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(out, s);
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
