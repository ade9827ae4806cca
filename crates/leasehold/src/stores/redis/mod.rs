//! The Redis store (`redis://[user:pass@]host:port/db`, `rediss://…` over TLS,
//! `redis+unix:///path/to/redis.sock?db=N&user=…&pass=…` over a Unix socket,
//! `redis+sentinel://…` / `rediss+sentinel://…` through Redis Sentinel): one Redis server.
//!
//! Checklist — native TTL: yes (`PX` on the record key; expiry judged by the server's clock, read
//! with `TIME` inside the scripts); watch: yes (pub/sub on a channel named like the record key:
//! force-release and the withdrawal of the first waiter in line always publish, a release
//! whenever a contender waits — a
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
//! # Semaphores and read-write locks
//! A semaphore's or read-write lock's key ([`AcquireRequest::permit`]) keeps one record too, its
//! permit table ([`LeaseRecord::permits`]) listing every holder, so `inspect` and `list` show
//! them all. Each permit has its own fence, from the key's one counter (so fences rise across
//! locks, permits, reads and writes), and its own expiry by the server's clock; the key's TTL is
//! the latest of them and of its waiters' places. Taking, renewing and releasing a permit cost one
//! script call each, as for a lock; a permit's release publishes when somebody waits for one. The
//! rules are those of the record stores (`decide/permits.rs`), kept in the scripts
//! (`lua/acquire_permit.lua`, and beside the lock's in the others).
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
//!
//! # Rules
//! Each script keeps one step of the rules every store shares (`crate::decide`: the same
//! record, the same judgements, on the server's clock), named here by its step:
//!
//! | server-side rule (`lua/`) | mirrors |
//! | --- | --- |
//! | `acquire_free.lua`, then `acquire.lua` | acquire → `decide::Rules::acquire` (the line: `tidy_line`, `wait_in_line`) |
//! | `acquire_permit.lua` | acquire of a permit → `decide::Rules::acquire` (`decide/permits.rs`) |
//! | `renew.lua` (after `renew_keys.lua` or `renew_node_args.lua`) | renew → `decide::Rules::renew` |
//! | `release_ours.lua`, then `release.lua` | release → `decide::Rules::release` |
//! | `withdraw.lua` | a waiter's withdrawal → the line's `leave_line` |
//! | `force.lua`, `force_holder.lua` | freed → `decide::Rules::freed` |
//! | the record key's `PX` TTL | removable → `decide::Rules::removable` (the server deletes an expired record: `cleanup` has nothing to do) |
//! | `mark_watched.lua`, `raise_fence.lua` | no rule: a wake-up mark; Redlock's fence floor |
//!
//! # Module map
//! One concern a file; each file uses only those below it in this table, so the modules form no
//! cycle: the store on top, Sentinel and Cluster below the link that asks them where to connect
//! and above the connections they make, and neither ever reaches for the store.
//!
//! | file | holds | uses |
//! | --- | --- | --- |
//! | `floor.rs` | the fenced floor, for measuring ([`crate::floor`]) | the store's link and key names |
//! | `mod.rs` | [`RedisStore`]: connecting, naming keys, the [`LockStore`] impl | all below |
//! | `renew.rs` | the renewal batcher: due renewals share one script call | link, cluster, scripts, error |
//! | `coalesce.rs` | acquisitions and releases sharing calls while the server is busy | link, cluster, scripts, conn, error |
//! | `link.rs` | the command connection, replaced after a failover, a hang or a refusal | sentinel, cluster, conn, error |
//! | `cluster.rs` | Redis Cluster: its URL, slot map, per-node pub/sub, `SCAN` of every primary | pubsub, conn, options, error |
//! | `sentinel.rs` | Redis Sentinel: its URL, the primary lookup, `+switch-master` followers | conn, options |
//! | `pubsub.rs` | the pub/sub hub that wakes waiters | conn |
//! | `permits.rs` | a permit request as a script call; the refusal of another kind of key | scripts |
//! | `scripts.rs` | the Lua scripts (`lua/*.lua`), their calls and batched forms | conn, options, error |
//! | `conn.rs` | the redis crate's connections and clients, calls bounded in time, `SCAN` | options, error |
//! | `options.rs` | [`RedisOptions`], URL query parameters, server lists, checks | — |
//! | `error.rs` | Redis errors as [`Error`]s that say whether a retry can help | — |

#[cfg(feature = "redis-cluster")]
pub(crate) mod cluster;
mod coalesce;
mod conn;
mod error;
pub(crate) mod floor;
mod foreign;
mod link;
mod options;
mod permits;
mod pubsub;
mod renew;
mod scripts;
mod sentinel;

/// Redlock reads its `redlock://` URL's servers as Sentinel and Cluster read theirs.
#[cfg(feature = "redlock")]
pub(crate) use options::host_list;
pub use options::RedisOptions;

use self::conn::{bounded, open_client, scan, Conn};
use self::error::map_err;
use self::link::{Link, Origin};
use self::options::{checked, Checked};
use self::pubsub::Hub;
use self::renew::{spawn_renewer, RenewJob, RenewScripts};
use self::scripts::{json_push, json_str, Lua, ScriptCall, Scripts};
use self::sentinel::Sentinels;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, ReleaseOutcome, RenewOutcome,
};
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;

/// The most bytes of holder id and labels a lease may carry ([`AcquireRequest::check_size`]):
/// far below Redis's 512 MB string limit, so every record stays quick to read and to decode in
/// the server's scripts.
pub const LABEL_LIMIT: usize = 1 << 20;

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
    /// The acquire and release calls in flight, and those queued for the next batch
    /// ([`coalesce`]).
    lanes: coalesce::Coalescer,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.link.described)
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

impl RedisStore {
    /// Connects to the server, Sentinel or Cluster of [`RedisOptions::url`].
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL the store or the redis crate cannot read,
    /// [`Error::InvalidOption`] for colliding prefixes, or [`Error::Unavailable`] when the
    /// server cannot be reached.
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use leasehold::stores::redis::{RedisOptions, RedisStore};
    /// use std::time::Duration;
    /// // The trading agents' prefix; a server that stops answering fails calls after 1 s.
    /// let mut opts = RedisOptions::new("redis://127.0.0.1:6379/0");
    /// opts.prefix = "agent:lock:".into();
    /// opts.timeout = Duration::from_secs(1);
    /// let store = RedisStore::connect(opts).await?;
    /// // The same: RedisStore::connect(RedisOptions::from_url(
    /// //     "redis://127.0.0.1:6379/0?prefix=agent:lock:&timeout=1s")?)
    /// let locks = leasehold::Locks::new(store);
    /// # let _ = locks; Ok(()) }
    /// ```
    pub async fn connect(opts: RedisOptions) -> Result<Self> {
        match crate::url::scheme_of(&opts.url).as_deref() {
            Some("redis+sentinel" | "rediss+sentinel") => Self::connect_sentinel(opts).await,
            #[cfg(feature = "redis-cluster")]
            Some("redis+cluster" | "rediss+cluster") => Self::connect_cluster(opts).await,
            #[cfg(not(feature = "redis-cluster"))]
            Some(scheme @ ("redis+cluster" | "rediss+cluster")) => Err(Error::FeatureNotEnabled {
                scheme: scheme.to_owned(),
                feature: "redis-cluster",
            }),
            _ => {
                let url = opts.url.clone();
                Self::connect_inner(&url, opts, false).await
            }
        }
    }

    /// Like [`connect`](Self::connect), but connects on first use (Redlock nodes may be down at
    /// start).
    pub(crate) async fn connect_inner(url: &str, opts: RedisOptions, lazy: bool) -> Result<Self> {
        let described = crate::url::redact(url);
        let checked = checked(&opts, &described)?;
        let client = open_client(url, &opts, &described)?;
        Self::start(client, Origin::Fixed, described, checked, opts, lazy).await
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
    fn assemble(
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
        let link = Arc::new(Link::new(
            origin,
            (conn, client, config),
            described,
            opts.timeout,
            wait.is_some(),
        ));
        let renewals = spawn_renewer(link.clone(), RenewScripts::of(&scripts));
        RedisStore {
            inner: Arc::new(Inner {
                link,
                scripts,
                prefix: opts.prefix,
                fence_prefix,
                hub: tokio::sync::Mutex::new(None),
                renewals,
                lanes: Default::default(),
            }),
        }
    }

    /// Reads a `redis+sentinel://…` or `rediss+sentinel://…` URL (see [`sentinel::parse`]) and
    /// connects to the primary the sentinels name for its master group, following their
    /// announcements of a new one from then on.
    async fn connect_sentinel(opts: RedisOptions) -> Result<Self> {
        let described = crate::url::redact(&opts.url);
        let named = sentinel::parse(opts, &described)?;
        let checked = checked(&named.opts, &described)?;
        let sentinels = Sentinels::open(&named, &described)?;
        let opts = named.opts;
        let client = sentinels.primary(&described, opts.timeout * 2).await?;
        let timeout = opts.timeout;
        let origin = Origin::Sentinel(sentinels);
        let store = Self::start(client, origin, described, checked, opts, false).await?;
        let link = &store.inner.link;
        if let Origin::Sentinel(sentinels) = &link.origin {
            sentinels.follow(
                Arc::downgrade(link),
                &link.described,
                timeout,
                Link::follow_switch,
            );
        }
        Ok(store)
    }

    /// Connects to the cluster of a `redis+cluster://` or `rediss+cluster://` URL.
    #[cfg(feature = "redis-cluster")]
    async fn connect_cluster(opts: RedisOptions) -> Result<Self> {
        let described = crate::url::redact(&opts.url);
        let cluster::Opened {
            conn,
            seed,
            nodes,
            checked,
            opts,
        } = cluster::open(opts, &described).await?;
        Ok(Self::assemble(
            conn,
            seed,
            Origin::Cluster(nodes),
            ConnectionManagerConfig::new(),
            described,
            checked,
            opts,
        ))
    }

    /// Checks `opts` as connecting would, without connecting ([`crate::fuzzing`]).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn check_options(opts: &RedisOptions) -> Result<()> {
        let described = crate::url::redact(&opts.url);
        match crate::url::scheme_of(&opts.url).as_deref() {
            Some("redis+sentinel" | "rediss+sentinel") => {
                sentinel::parse(opts.clone(), &described)?;
            }
            #[cfg(feature = "redis-cluster")]
            Some("redis+cluster" | "rediss+cluster") => {
                cluster::parse(opts.clone(), &described)?;
            }
            _ => {}
        }
        checked(opts, &described).map(drop)
    }

    fn record_key(&self, key: &Key) -> String {
        self.name(&self.inner.prefix, key)
    }

    /// The key a record key `name` (found by a scan) is of: `name` without the prefix (and, on a
    /// cluster, the hash tag's braces).
    pub(crate) fn key_of(&self, name: &str) -> String {
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
    /// ours: another client's lock ([`foreign::record`]), from its type, length and PTTL and the server's
    /// time, read in one round trip; `None` when it is gone.
    pub(crate) async fn foreign_inspection(
        &self,
        key: &str,
        name: &str,
    ) -> Result<Option<Inspection>> {
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
        Ok(Some(Inspection::Record(foreign::record(
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
            return cluster::check_key(key);
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
        let lanes = &self.inner.lanes;
        let answer = match &link.origin {
            #[cfg(feature = "redis-cluster")]
            Origin::Cluster(nodes) => lanes.send_to_primary(link, nodes, batched, call).await?,
            _ => lanes.send(link, batched, call).await?,
        };
        ::redis::from_redis_value(answer).map_err(|e| map_err(&link.described, e.into()))
    }

    /// A call of `script` (one of ours that takes one key) on `key` with `args`.
    fn one_key(script: &Lua, key: String, args: &[&str]) -> ScriptCall {
        Self::keys_call(script, &[key], args)
    }

    /// A call of `script` with `keys`, then `args`.
    fn keys_call(script: &Lua, keys: &[String], args: &[&str]) -> ScriptCall {
        let bytes = keys.iter().map(String::len).sum::<usize>()
            + args.iter().map(|a| a.len()).sum::<usize>();
        let mut call = script.prepare(keys.len(), args.len(), bytes);
        for k in keys {
            call.arg(k);
        }
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
    /// (their prefixes are the same). With `line`, a waiter finding another registered stands in
    /// the key's line behind it; without (Redlock's nodes), it waits without a place.
    pub(crate) fn acquire_call(&self, req: &AcquireRequest, line: bool) -> ScriptCall {
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
        let ttl_ms = crate::record::ms(req.ttl);
        let mut tail = format!(
            ",\"ttl_ms\":{ttl_ms},\"waiter\":null,\"waiter_token\":null,\"waiter_expires\":null,\"pid\":{},\"host\":",
            crate::holder::pid()
        )
        .into_bytes();
        json_push(&mut tail, crate::holder::host());
        tail.extend_from_slice(b",\"labels\":");
        let mark = tail.len();
        if serde_json::to_writer(&mut tail, &req.labels).is_err() {
            tail.truncate(mark);
            tail.extend_from_slice(b"{}");
        }
        tail.push(b'}');
        let waiter_ms = req.waiter_ttl.map_or(0, |d| {
            i64::try_from(d.as_millis().max(1)).unwrap_or(i64::MAX)
        });
        let waiter_ms = if line { waiter_ms } else { -waiter_ms };
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
            ::redis::Value::BulkString(fast) if req.permit.is_none() => {
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
                return Ok(AcquireOutcome::Held(foreign::record(
                    key, &kind, len, pttl, now,
                )));
            }
            ::redis::Value::Array(a) if a.first() == Some(&::redis::Value::Int(3)) => {
                // A key of another kind than asked, with a holder or a waiter.
                let (_, kind, permits) =
                    ::redis::from_redis_value::<(i64, String, u32)>(::redis::Value::Array(a))
                        .map_err(|e| self.garbage(key, &e.to_string()))?;
                return Err(permits::refusal(req, &kind, permits).unwrap_or_else(|| {
                    self.garbage(key, &format!("a key of an unknown kind {kind:?}"))
                }));
            }
            other => ::redis::from_redis_value::<(i64, Option<Vec<u8>>)>(other)
                .map_err(|e| self.garbage(key, &e.to_string()))?,
        };
        let raw = raw.unwrap_or_default();
        if granted == 1 {
            let rec = self.parse(key, &raw)?;
            // A permit's holder is handed its permit in the lock fields.
            if req.permit.is_some() || rec.permits.is_some() {
                return Ok(AcquireOutcome::Granted(crate::decide::view(
                    &rec, &req.token,
                )));
            }
            return Ok(AcquireOutcome::Granted(rec));
        }
        let rec = match self.parse(key, &raw) {
            // A contender is handed the permit holders in words.
            Ok(r) if r.permits.is_some() => crate::decide::held_view(&r),
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

    /// The release script call for `token` on `key`; with `grant`, the release grants the lease
    /// to the first in line ([`crate::Capabilities::release_grants`]; not on Redlock's nodes,
    /// whose waiters are registered on each node apart, so that nodes could grant different
    /// waiters and none win a majority).
    pub(crate) fn release_call(&self, key: &Key, token: &str, grant: bool) -> ScriptCall {
        let script = &self.inner.scripts.release;
        let keys = [self.record_key(key), self.fence_key(key)];
        let grant = if grant { "1" } else { "0" };
        Self::keys_call(script, &keys, &[token, &json_str(token), grant])
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

#[async_trait]
impl LockStore for RedisStore {
    fn describe(&self) -> String {
        self.inner.link.described.clone()
    }

    fn floor(&self) -> Option<Arc<dyn crate::floor::Floor>> {
        Some(self.fenced_floor())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: true,
            watch: true,
            liveness: false,
            fence_source: "INCR of a per-key counter key in the acquire script",
            waiter_line: true,
            release_grants: true,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::Server,
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        self.check(&req.key)?;
        req.check_size(LABEL_LIMIT, &self.describe())?;
        let call = match req.permit {
            Some(want) => {
                want.validate()?;
                let (record_key, fence_key) = (self.record_key(&req.key), self.fence_key(&req.key));
                let script = &self.inner.scripts.acquire_permit;
                permits::call(script, record_key, fence_key, req, want)
            }
            None => self.acquire_call(req, true),
        };
        let answer = match self.call(&call).await {
            Err(e) if call.lua.waits_for_replicas() => {
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
            ttl_ms: crate::record::ms(ttl),
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
        let answer = self.call(&self.release_call(key, token, true)).await?;
        Ok(Self::release_answer(answer))
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        self.check(key)?;
        let script = &self.inner.scripts.withdraw;
        let _: i64 = self
            .call(&Self::keys_call(
                script,
                &[self.record_key(key), self.fence_key(key)],
                &[token],
            ))
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
            Ok(Some(raw)) => match foreign::inspection(&raw) {
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
                cluster::scan_all(c, &pattern, &link.described, link.timeout).await?
            }
            Conn::One(..) => scan(&pattern, |page| async move { self.query(&page).await }).await?,
        };
        names.sort();
        names.dedup();
        let mut out = vec![];
        for chunk in names.chunks(500) {
            let raws: Vec<Option<Vec<u8>>> = self.query(::redis::cmd("MGET").arg(chunk)).await?;
            for (name, raw) in chunk.iter().zip(raws) {
                if let Some(i) = raw.as_deref().and_then(foreign::inspection) {
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

    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        self.check(key)?;
        let script = &self.inner.scripts.force_holder;
        let raw: Option<Vec<u8>> = self
            .call(&Self::one_key(script, self.record_key(key), &[holder]))
            .await?;
        // Something was freed: the record as it was (the script read it as one of ours).
        raw.map(|raw| self.parse(key.as_str(), &raw)).transpose()
    }

    async fn cleanup(
        &self,
        _older_than: Duration,
        _progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
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

/// `s` with the characters `SCAN`'s `MATCH` treats as a pattern escaped.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_store_never_shows_its_password() {
        let url = "redis://u:hunter2@127.0.0.1:1/0";
        // Lazy: nothing connects.
        let store = RedisStore::connect_inner(url, RedisOptions::default(), true)
            .await
            .expect("a lazy store");
        let shown = format!("{store:?} {}", store.describe());
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://u:***@127.0.0.1:1/0"), "{shown}");
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }
}
