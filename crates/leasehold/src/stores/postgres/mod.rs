//! The PostgreSQL lock store: `postgres://user[:password]@host:port/db[?schema=…&table=…]`
//! ([`PostgresOptions::from_url`], [`PostgresStore::connect`]).
//!
//! Checklist — native TTL: yes in effect (every expiry is judged by the server's clock, `now()`
//! of the statement, never by a client's; expired rows are kept, free, until `cleanup`, so
//! [`Capabilities::native_ttl`] is false); watch: yes (`LISTEN/NOTIFY`, see below); liveness: no
//! (a dead holder's lease lapses at its TTL: a session that ends says nothing of whether its
//! holder still acts); fence: a PostgreSQL sequence per table, which no deletion lowers, taken on
//! the locked row: a grant of `n` fences takes `n` values of it and is fenced with the largest,
//! so every grant of a key is above every earlier one, also after `cleanup` deleted the key's row
//! or the server restarted.
//!
//! - **One row per key** in a table created on first use (idempotent: `CREATE … IF NOT EXISTS`,
//!   one creator at a time; nothing is created when the table is there). Its columns: `key`,
//!   `holder`, `token` (the owner token), `fence`, `acquired`, `renewed`, `expires`, `ttl_ms`,
//!   `waiter`, `waiter_token`, `waiter_expires`, `waiter_ttl_ms`, `pid`, `host`, `labels` (JSON
//!   text), `watched` (a contender waits for this lease's release), and for semaphores and
//!   read-write locks `permit_kind` (`semaphore`, `read-write`, NULL for a lock), `permit_count`
//!   and `waiter_write` (the registered waiter is a writer). A table made by an earlier version
//!   gets the columns it lacks (`ALTER TABLE … ADD COLUMN IF NOT EXISTS`). A user without the
//!   right to create it gets a non-retryable error naming the DDL to run.
//! - **Permits** ([`Capabilities::permits`]): each permit held is a row of the permit table
//!   `table_permits` (key, token, holder, fence, write, times, TTL, pid, host, labels), created
//!   with the lease table; the key's row keeps the key's kind, its fence (each grant takes the
//!   sequence's next value, so fences rise across locks, permits, reads and writes), its one
//!   registered waiter and its `watched` mark, and no lock holder. The rules are
//!   `decide::permits`'s with one registered waiter for the line: a semaphore of `n` grants while
//!   the live holders, the registered waiter (if another's) and the caller are at most `n`; a
//!   writer only with no live holder and no other registered waiter; a reader with no writer
//!   holding or registered as waiter, below [`PERMIT_LIMIT`](crate::PERMIT_LIMIT) holders. A
//!   request of another kind or count while the key has a live holder or waiter is refused
//!   ([`Error::InvalidOption`] `permits`); a key with neither takes the kind asked, keeping its
//!   fence. A permit acquisition is one statement judged on its snapshot and written only if
//!   the key's row is still the version it read (every statement that changes a permit row
//!   writes its key's row first); one that finds it changed writes nothing and is run again
//!   (under contention on one key, a few times). Renewals, releases and waiter withdrawals of
//!   a permit go through the lock's statements, which tell a permit's token by the key's row.
//!   A lock request on a permit key with no live holder or waiter makes it a lock key again
//!   first (two statements more, once).
//! - **One statement per step**, each judged by the server's clock: acquire-when-free and
//!   takeover of an expired row are one `INSERT … ON CONFLICT (key) DO UPDATE … WHERE <free,
//!   expired, or reserved for us> RETURNING fence, acquired, expires`; when it writes nothing
//!   (held), the whole acquire statement, the same upsert that also registers the caller as
//!   waiter or marks the row watched, answers the record (a caller that already found the key
//!   held, or asks for a block of fences, sends only that one); renewal is one `UPDATE … WHERE
//!   token = $token AND expires > now()`, for many leases at once (`FROM unnest($keys, $tokens,
//!   $ttls)`: the renewals asked for while one statement runs go together in the next, permits'
//!   with locks'); release is one `UPDATE` that keeps the row (free, its fence kept) and
//!   notifies when someone waits (a permit's deletes its permit row too). Only a step that
//!   fails (a lost renewal, a contended acquire whose row was not written) reads the row again
//!   to say why.
//! - **Wake-ups**: a release whose row has a live registered waiter, or was marked `watched` by
//!   a contender that waits for notifications (its attempt found the key held) or by an
//!   observer ([`LockStore::notify_release`]), runs `pg_notify` on the channel `schema.table`
//!   with the key as payload, delivered at its commit, and clears the mark; so does every
//!   force-release and waiter withdrawal; a permit's release notifies the same way, so waiting
//!   permit contenders wake on it. An uncontended release notifies nobody: every
//!   transaction that notifies commits through the server's one notification queue, in turn.
//!   The store's connection listens there, and waiters wake on it rather than by polling. When
//!   the connection ends, every waiter is woken and subscribes again, which connects (and
//!   listens) again.
//! - **One connection** per store, shared by all its calls (pipelined: many tasks' statements
//!   are in flight on it at once); each statement is prepared once per connection. Every call
//!   is bounded by `?timeout=` (default 10 s): a server that stops answering fails the call,
//!   retryably, and the next call connects again; so does the first call after the server ended
//!   the connection (a restart). TLS as libpq sets it (`sslmode`, `sslrootcert`, `sslcert`,
//!   `sslkey`), shared with the PostgreSQL queue.
//! - **Limits**: keys are any [`Key`] (bind parameters only; no key is ever written into SQL
//!   text); labels of at most [`MAX_LABEL_BYTES`] bytes as JSON and holders of at most
//!   [`MAX_HOLDER_BYTES`] bytes without NUL, else [`Error::InvalidOption`] at acquire; at most
//!   [`MAX_FENCES`] fences per grant.
//!
//! # Rules
//! Each statement (`sql/*.sql`, filled in by `sql.rs`) keeps one step of the rules every store
//! shares (`crate::decide`), with one registered waiter for the line, named here by its step:
//!
//! | server-side rule (`sql/`) | mirrors |
//! | --- | --- |
//! | `acquire_free.sql`, then `acquire.sql` | acquire → `decide::Rules::acquire` |
//! | `permit_acquire.sql` (and `to_lock.sql` before a lock's) | acquire of a permit → `decide::Rules::acquire` (`decide/permits.rs`) |
//! | `renew.sql` (`lost.sql` says why one was not) | renew → `decide::Rules::renew` |
//! | `release.sql` | release → `decide::Rules::release` |
//! | `withdraw.sql` | a waiter's withdrawal → the line's `leave_line` |
//! | `force.sql` | freed → `decide::Rules::freed` |
//! | `cleanup.sql` | removable → `decide::Rules::removable` |
//! | `mark_watched.sql`, `inspect.sql`, `list.sql`, `create*.sql`, `upgrade.sql`, `exists.sql` | no rule: a wake-up mark, reads, the tables |
//!
//! ```no_run
//! # async fn f() -> leasehold::Result<()> {
//! let locks = leasehold::connect("postgres://locker@db.internal:5432/app?table=leases").await?;
//! let guard = locks.lock("nightly-report")?.acquire().await?;
//! println!("fence {}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod floor;
mod options;
mod permits;
mod renew;
mod sql;
mod watch;

use crate::error::{Error, Result};
use crate::key::Key;
use crate::pg::conn::pg_err;
use crate::pg::link::Link;
use crate::record::LeaseRecord;
use crate::store::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWatch, CleanupProgress, CleanupReport,
    Inspection, LockStore, LostReason, ReleaseOutcome, RenewOutcome,
};
use async_trait::async_trait;
pub use options::PostgresOptions;
use sql::Sql;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Row;

/// The largest labels a lease carries, as JSON (`{"name":"value",…}`) in bytes.
pub const MAX_LABEL_BYTES: usize = 64 * 1024;
/// The longest holder name, in bytes.
pub const MAX_HOLDER_BYTES: usize = 4 * 1024;
/// The most fences one grant reserves ([`AcquireRequest::fences`]).
pub const MAX_FENCES: u64 = 100_000;

/// The store connection's settings: its statements are planned once, when prepared (the
/// server would otherwise plan the acquire statement again at each run, which costs more than
/// running it).
const SESSION: &str = "SET plan_cache_mode = force_generic_plan";

/// The advisory lock that makes one table creator at a time (any fixed number; the queue's is
/// another).
const CREATE_LOCK: i64 = 7_451_830_022;

/// A lock store on a PostgreSQL table.
///
/// # Expiry
/// A lease expires at `expires` on the server's clock; a renewal or release that reaches the
/// server later is refused, whatever the client's clock says.
///
/// # Errors
/// Calls fail with [`Error::Unavailable`] (retryable) when the server cannot be reached or does
/// not answer within `?timeout=`, and with [`Error::Store`] when it refuses a statement.
///
/// ```no_run
/// # async fn f() -> leasehold::Result<()> {
/// use leasehold::{stores::postgres::{PostgresOptions, PostgresStore}, Locks};
/// let o = PostgresOptions::from_url("postgres://locker@127.0.0.1:5432/app?table=leases")?;
/// let store = PostgresStore::connect(o).await?;
/// let locks = Locks::new(store);
/// # drop(locks); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    link: Link,
    sql: Sql,
    hub: Arc<watch::Hub>,
    batch: renew::Batch,
    channel: String,
}

impl PostgresStore {
    /// Connects to the database of `options.url` and creates the lease table if it is not
    /// there.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL the driver or the connection's parameters refuse;
    /// [`Error::InvalidOption`] for a bad schema or table name; [`Error::Unavailable`] when the
    /// server cannot be reached; [`Error::Store`] (non-retryable) when the table is missing and
    /// the user may not create it (the message names the DDL to run).
    ///
    /// ```no_run
    /// # async fn f() -> leasehold::Result<()> {
    /// use leasehold::stores::postgres::{PostgresOptions, PostgresStore};
    /// let mut o = PostgresOptions::new("postgres://locker@127.0.0.1:5432/app?timeout=5s");
    /// o.table = "leases".into();
    /// let store = PostgresStore::connect(o).await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub async fn connect(options: PostgresOptions) -> Result<Self> {
        let target = options.target()?;
        let hub = Arc::new(watch::Hub::default());
        let channel = options.channel();
        let link = Link::new(target, channel.clone(), hub.listener(), SESSION);
        let inner = Inner {
            link,
            sql: Sql::new(&options.schema, &options.table),
            hub,
            batch: renew::Batch::default(),
            channel,
        };
        inner.migrate().await?;
        Ok(PostgresStore {
            inner: Arc::new(inner),
        })
    }
}

impl Inner {
    /// Creates the table and its sequence unless both are there (and the schema unless it is).
    async fn migrate(&self) -> Result<()> {
        let sql = &self.sql;
        let there = |l: Arc<crate::pg::link::Live>| async move {
            let row = l
                .conn
                .query_one(
                    &sql.exists,
                    &[&sql.table, &sql.sequence, &sql.schema, &sql.permits],
                )
                .await?;
            Ok((
                row.try_get::<_, bool>(0)?,
                row.try_get::<_, bool>(1)?,
                row.try_get::<_, bool>(2)?,
                row.try_get::<_, bool>(3)?,
            ))
        };
        let (table, schema, watched, permits) = self.link.call(there).await?;
        if table && watched && permits {
            return self.prepare().await;
        }
        let needed = match (table, schema) {
            // A table made by an earlier version: its newer columns, and the permit table.
            (true, _) => sql.upgrade.clone(),
            (false, true) => sql.create.clone(),
            (false, false) => format!("{}\n{}", sql.create_schema, sql.create),
        };
        let ddl = format!("BEGIN; SELECT pg_advisory_xact_lock({CREATE_LOCK}); {needed} COMMIT;");
        let live = self.link.get().await?;
        let ran = tokio::time::timeout(self.link.timeout(), live.conn.batch_execute(&ddl)).await;
        let Ok(ran) = ran else {
            return Err(Error::no_answer(self.link.shown()));
        };
        match ran {
            Ok(()) => self.prepare().await,
            Err(e) => {
                let _ = live.conn.batch_execute("ROLLBACK").await;
                if e.code().is_some_and(|c| c.code() == "42501") {
                    return Err(Error::Store {
                        source: None,
                        store: self.link.shown().to_owned(),
                        detail: format!(
                            "the lease table {} is not there (or lacks its newer columns, or its \
                             permit table {}) and this user may not create it ({}); have it \
                             created with:\n{needed}",
                            sql.table,
                            sql.permits,
                            e.as_db_error().map_or("permission denied", |d| d.message()),
                        ),
                        retryable: false,
                    });
                }
                Err(pg_err(self.link.shown(), e))
            }
        }
    }

    /// Prepares the hot statements (acquire, renew, release) on the connection, so that the first
    /// renewal of a short lease does not wait for its statement's planning.
    async fn prepare(&self) -> Result<()> {
        let sql = &self.sql;
        self.link
            .call(|l| async move {
                for text in [&sql.acquire_free, &sql.acquire, &sql.renew, &sql.release] {
                    l.conn.prepared.get(&l.conn.client, text).await?;
                }
                Ok(())
            })
            .await
    }

    /// Runs the query `sql` with `params`, prepared, on the shared connection: its rows.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        self.link
            .call(|l| async move { l.conn.prepared.query(&l.conn.client, sql, params).await })
            .await
    }

    /// Renews each lease or permit `keys[i]` held under `tokens[i]` for `ttls[i]` ms, in one
    /// statement; the outcomes in the same order.
    async fn renew_many(
        &self,
        keys: &[&str],
        tokens: &[&str],
        ttls: &[i64],
    ) -> Result<Vec<RenewOutcome>> {
        let rows = self
            .query(&self.sql.renew, &[&keys, &tokens, &ttls])
            .await?;
        let mut renewed: HashMap<(String, String), LeaseRecord> = HashMap::new();
        for r in &rows {
            let token: String = r.try_get(19).map_err(|e| self.err(e))?;
            let key: String = r.try_get(0).map_err(|e| self.err(e))?;
            let rec = self.full_record(r, 0, &key)?;
            // A permit's holder is handed its permit in the lock fields.
            let rec = match rec.permits {
                Some(_) => crate::decide::permits::view(&rec, &token),
                None => rec,
            };
            renewed.insert((key, token), rec);
        }
        let (missing_keys, missing_tokens): (Vec<&str>, Vec<&str>) = keys
            .iter()
            .zip(tokens)
            .filter(|(k, t)| !renewed.contains_key(&(k.to_string(), t.to_string())))
            .map(|(k, t)| (*k, *t))
            .unzip();
        // Per key and token: the key's holder and token, and whether the token's permit row is
        // still there.
        type Found = (Option<String>, Option<String>, bool);
        let mut found: HashMap<(String, String), Found> = HashMap::new();
        if !missing_keys.is_empty() {
            for r in self
                .query(&self.sql.lost, &[&missing_keys, &missing_tokens])
                .await?
            {
                let got = (|| {
                    Ok::<_, tokio_postgres::Error>((
                        r.try_get(0)?,
                        r.try_get(1)?,
                        (r.try_get(2)?, r.try_get(3)?, r.try_get(4)?),
                    ))
                })();
                let (k, t, f): (String, String, Found) =
                    got.map_err(|e| pg_err(self.link.shown(), e))?;
                found.insert((k, t), f);
            }
        }
        Ok(keys
            .iter()
            .zip(tokens)
            .map(|(k, t)| {
                let pair = (k.to_string(), t.to_string());
                if let Some(rec) = renewed.get(&pair) {
                    return RenewOutcome::Renewed(rec.clone());
                }
                RenewOutcome::Lost(match found.get(&pair) {
                    // Its permit is there, and was not renewed: it expired.
                    Some((_, _, true)) => LostReason::Expired,
                    None | Some((_, None, _)) => LostReason::Released,
                    Some((_, Some(tok), _)) if tok == t => LostReason::Expired,
                    Some((holder, Some(_), _)) => LostReason::TakenOver {
                        holder: holder.clone().unwrap_or_default(),
                    },
                })
            })
            .collect())
    }

    /// A lock acquisition for `req` with its labels as JSON. A permit key that has no live
    /// holder and no live waiter is made a lock key first; one that has either refuses it.
    async fn acquire_row(&self, req: &AcquireRequest, labels: &str) -> Result<AcquireOutcome> {
        for _ in 0..3 {
            match self.acquire_lock(req, labels).await? {
                AcquireOutcome::Held(r) if r.permits.is_some() => {
                    if let Some(is) = self.to_lock(&req.key).await? {
                        return Err(permits::lock_refused(&req.key, &is));
                    }
                }
                out => return Ok(out),
            }
        }
        Err(self.kept_changing(req.key.as_str()))
    }

    /// The lock statements for `req`: the grant, or the record as it is (a permit key's among
    /// them: the lock statements never write one).
    async fn acquire_lock(&self, req: &AcquireRequest, labels: &str) -> Result<AcquireOutcome> {
        let (ttl, wttl) = (millis(req.ttl), req.waiter_ttl.map_or(0, millis));
        let fences = i64::try_from(req.fences.max(1)).unwrap_or(1);
        let pid = i32::try_from(crate::holder::pid()).unwrap_or(0);
        let host = crate::holder::host();
        let key = req.key.as_str();
        // A caller that watches already found the key held, and a block of fences: straight to
        // the whole statement.
        if !req.watching && fences == 1 {
            let rows = self
                .query(
                    &self.sql.acquire_free,
                    &[&key, &req.holder, &req.token, &ttl, &labels, &pid, &host],
                )
                .await?;
            if let Some(r) = rows.first() {
                let granted = (|| {
                    let fence: i64 = r.try_get(0)?;
                    let acquired: std::time::SystemTime = r.try_get(1)?;
                    let expires: std::time::SystemTime = r.try_get(2)?;
                    Ok::<_, tokio_postgres::Error>((fence, acquired, expires))
                })();
                let (fence, acquired, expires) = granted.map_err(|e| self.err(e))?;
                let mut rec = LeaseRecord::free(key, 0);
                crate::decide::grant(&mut rec, req, unsigned(fence), unix_ms(acquired));
                // The expiry the server wrote (counted from the grant's own clock reading).
                rec.expires_ms = unix_ms(expires);
                return Ok(AcquireOutcome::Granted(rec));
            }
        }
        let watching = req.watching;
        // A row deleted (cleanup) between the statement and the read is acquired again.
        for _ in 0..3 {
            let rows = self
                .query(
                    &self.sql.acquire,
                    &[
                        &key,
                        &req.holder,
                        &req.token,
                        &ttl,
                        &wttl,
                        &labels,
                        &fences,
                        &pid,
                        &host,
                        &watching,
                    ],
                )
                .await?;
            if let Some(r) = rows.first() {
                let rec = record(r).map_err(|e| self.err(e))?;
                let granted: bool = r.try_get(15).map_err(|e| self.err(e))?;
                return Ok(if granted {
                    AcquireOutcome::Granted(rec)
                } else {
                    AcquireOutcome::Held(rec)
                });
            }
            // Held, and nothing to write: the row as it is now.
            if let Some(r) = self.query(&self.sql.inspect, &[&key]).await?.first() {
                return Ok(AcquireOutcome::Held(self.full_record(r, 0, key)?));
            }
        }
        Err(Error::Store {
            source: None,
            store: self.link.shown().to_owned(),
            detail: format!("the row of {} kept changing while it was acquired", req.key),
            retryable: true,
        })
    }

    /// The release statement (of a lock or a permit): whether it was still live.
    async fn release_row(&self, key: &str, token: &str) -> Result<ReleaseOutcome> {
        let rows = self
            .query(&self.sql.release, &[&key, &token, &self.channel, &key])
            .await?;
        let mut live = false;
        for r in &rows {
            live |= r.try_get::<_, bool>(0).map_err(|e| self.err(e))?;
        }
        Ok(if live {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    fn err(&self, e: tokio_postgres::Error) -> Error {
        pg_err(self.link.shown(), e)
    }
}

/// Refuses what the table cannot hold or give back as it was written.
fn check(req: &AcquireRequest) -> Result<String> {
    if req.holder.len() > MAX_HOLDER_BYTES || req.holder.contains('\0') {
        return Err(Error::option(
            "holder",
            format!("at most {MAX_HOLDER_BYTES} bytes, without NUL, on the PostgreSQL store"),
        ));
    }
    if req.fences > MAX_FENCES {
        return Err(Error::option(
            "fences",
            format!("at most {MAX_FENCES} fences per grant on the PostgreSQL store"),
        ));
    }
    let labels =
        serde_json::to_string(&req.labels).map_err(|e| Error::option("labels", e.to_string()))?;
    if labels.len() > MAX_LABEL_BYTES {
        return Err(Error::option(
            "labels",
            format!(
                "{} bytes as JSON; the PostgreSQL store keeps at most {MAX_LABEL_BYTES}",
                labels.len()
            ),
        ));
    }
    Ok(labels)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A server's time as Unix milliseconds (0 before 1970), as `sql::ms` writes it.
fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, crate::record::ms)
}

/// The record in a row of the store's columns (see `sql::columns`).
fn record(r: &Row) -> std::result::Result<LeaseRecord, tokio_postgres::Error> {
    record_at(r, 0)
}

/// The record in the store's columns starting at column `at` of a row.
fn record_at(r: &Row, at: usize) -> std::result::Result<LeaseRecord, tokio_postgres::Error> {
    let key: String = r.try_get(at)?;
    let mut rec = LeaseRecord::free(&key, unsigned(r.try_get(at + 3)?));
    rec.holder = r.try_get(at + 1)?;
    rec.token = r.try_get(at + 2)?;
    rec.acquired_ms = unsigned(r.try_get(at + 4)?);
    rec.renewed_ms = unsigned(r.try_get(at + 5)?);
    rec.expires_ms = unsigned(r.try_get(at + 6)?);
    rec.ttl_ms = unsigned(r.try_get(at + 7)?);
    rec.waiter = r.try_get(at + 8)?;
    rec.waiter_token = r.try_get(at + 9)?;
    rec.waiter_expires_ms = Some(unsigned(r.try_get(at + 10)?)).filter(|&v| v > 0);
    rec.waiter_ttl_ms = r.try_get::<_, Option<i64>>(at + 11)?.map(unsigned);
    rec.pid = r
        .try_get::<_, Option<i32>>(at + 12)?
        .and_then(|p| u32::try_from(p).ok());
    rec.host = r.try_get(at + 13)?;
    let labels: String = r.try_get(at + 14)?;
    // Labels someone else wrote that are not a JSON object of strings read as none.
    rec.labels = serde_json::from_str(&labels).unwrap_or_default();
    Ok(rec)
}

#[async_trait]
impl LockStore for PostgresStore {
    fn describe(&self) -> String {
        self.inner.link.shown().to_owned()
    }

    fn floor(&self) -> Option<Arc<dyn crate::floor::Floor>> {
        Some(Arc::new(floor::PostgresFloor::new(self.inner.clone())))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            native_ttl: false,
            watch: true,
            liveness: false,
            fence_source: "a PostgreSQL sequence per table, never lowered by cleanup",
            waiter_line: false,
            release_grants: false,
            permits: true,
            expiry_clock: crate::store::ExpiryClock::Server,
        }
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<AcquireOutcome> {
        let labels = check(req)?;
        match req.permit {
            Some(want) => self.inner.acquire_permit(req, want, &labels).await,
            None => self.inner.acquire_row(req, &labels).await,
        }
    }

    async fn renew(&self, key: &Key, token: &str, ttl: Duration) -> Result<RenewOutcome> {
        let inner = &self.inner;
        renew::renew(
            inner,
            key.as_str().to_owned(),
            token.to_owned(),
            millis(ttl),
        )
        .await
    }

    async fn release(&self, key: &Key, token: &str) -> Result<ReleaseOutcome> {
        self.inner.release_row(key.as_str(), token).await
    }

    async fn withdraw_waiter(&self, key: &Key, token: &str) -> Result<()> {
        let inner = &self.inner;
        let k = key.as_str();
        inner
            .query(&inner.sql.withdraw, &[&k, &token, &inner.channel, &k])
            .await?;
        Ok(())
    }

    async fn notify_release(&self, key: &Key, fence: Option<u64>) -> Result<bool> {
        let inner = &self.inner;
        // A fence beyond the sequence's range is no fence of the key's.
        let fence = match fence.map(i64::try_from) {
            Some(Err(_)) => return Ok(false),
            Some(Ok(f)) => Some(f),
            None => None,
        };
        let rows = inner
            .query(&inner.sql.mark_watched, &[&key.as_str(), &fence])
            .await?;
        match rows.first() {
            Some(r) => r.try_get::<_, bool>(0).map_err(|e| inner.err(e)),
            None => Ok(true),
        }
    }

    async fn inspect(&self, key: &Key) -> Result<Option<Inspection>> {
        let inner = &self.inner;
        let k = key.as_str();
        let rows = inner.query(&inner.sql.inspect, &[&k]).await?;
        rows.first()
            .map(|r| inner.full_record(r, 0, k).map(Inspection::Record))
            .transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Inspection>> {
        let inner = &self.inner;
        let rows = inner.query(&inner.sql.list, &[&prefix]).await?;
        rows.iter()
            .map(|r| inner.full_record(r, 0, prefix).map(Inspection::Record))
            .collect()
    }

    async fn force_release(&self, key: &Key) -> Result<Option<LeaseRecord>> {
        if let Some(was) = self.inner.force(key, None).await? {
            return Ok(Some(was));
        }
        // Nothing held: the record as it is.
        Ok(match self.inspect(key).await? {
            Some(Inspection::Record(r)) => Some(r),
            _ => None,
        })
    }

    async fn force_release_holder(&self, key: &Key, holder: &str) -> Result<Option<LeaseRecord>> {
        self.inner.force(key, Some(holder)).await
    }

    async fn cleanup(
        &self,
        older_than: Duration,
        progress: &CleanupProgress,
    ) -> Result<CleanupReport> {
        // One statement judges and deletes: the counts are known only at its end.
        let inner = &self.inner;
        let text = inner.sql.cleanup(millis(older_than));
        let text = text.as_str();
        let answer = inner
            .link
            .call(|l| async move { l.conn.client.simple_query(text).await })
            .await?;
        let row = answer.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        });
        let count = |i: usize| -> Result<usize> {
            let v = row.and_then(|r| r.get(i)).unwrap_or("0");
            v.parse().map_err(|_| Error::Store {
                source: None,
                store: inner.link.shown().to_owned(),
                detail: format!("cleanup answered {v:?} for a count"),
                retryable: false,
            })
        };
        let (removed, total) = (count(0)?, count(1)?);
        progress.add_finished(total.max(removed) as u64);
        Ok(CleanupReport {
            removed,
            kept: total.saturating_sub(removed),
        })
    }

    async fn subscribe(&self, key: &Key) -> Result<Option<Box<dyn ChangeWatch>>> {
        let live = self.inner.link.get().await?;
        Ok(Some(Box::new(
            self.inner.hub.subscribe(key.as_str(), live.flag()),
        )))
    }
}
