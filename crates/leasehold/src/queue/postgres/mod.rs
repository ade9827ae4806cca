//! The queue in PostgreSQL (`postgres://user[:password]@host:port/db`), for workers on many hosts.
//!
//! - Dispatch with `FOR UPDATE SKIP LOCKED`: a claim locks one free **slot row** (the global
//!   capacity: rows `0..max_running` of `queue_slots`) and the chosen **key row** of
//!   `queue_keys` (whose `running` column names the key's running task), skipping rows other
//!   claimers hold; concurrent claimers never wait on each other and never give out a slot or a
//!   key twice. A per-group limit locks the group's row (`queue_groups`) and recounts.
//! - Wake-up with `LISTEN/NOTIFY` on the channel `leasehold_queue`: every change that can let a
//!   task run notifies at commit; [`changed`](QueueBackend::changed) returns on it.
//! - Times (claims, heartbeats, timeouts, aging) come from the server's clock, so hosts with
//!   skewed clocks agree.
//! - One connection per [`PgQueue`], on which the statements of the hot calls (claim, heartbeat,
//!   finish) are prepared once and reused. TLS (rustls) as libpq sets it in the URL: `sslmode`
//!   (`disable`, `prefer` — the default —, `require`, `verify-ca`, `verify-full`), `sslrootcert`
//!   (a PEM file of CAs, or `system`; the system's trust store by default), and `sslcert` with
//!   `sslkey` for a server that asks for a client certificate. `prefer` and `require` without a
//!   CA encrypt but do not check who answers; use `verify-full` across a network you do not
//!   trust. A certificate that fails its check, a server without TLS under `require` and up, and
//!   credentials the server refuses fail the connection with a non-retryable error naming the
//!   cause (retrying cannot help); a server that cannot be reached, with a retryable one.
//!   When the server ends it (a restart, `pg_terminate_backend`, a proxy's idle timeout) the next
//!   call connects again (listening again too); at most the call that found it ended fails, with a
//!   retryable error.
//! - Every call is bounded by `?timeout=` (default 10 s; also the connect's bound): a server that
//!   stops answering fails it with a retryable error, and the connection is dropped (the server
//!   rolls back what the call had not committed) and made again by the next call. A call whose
//!   commit the server ran but whose answer was lost (the connection ended, or the timeout ran
//!   out, in between) is reported failed: a claim made that way is recorded as the worker's but
//!   not known to it; [`claims`](QueueBackend::claims) names it, and a
//!   [`Worker`](super::worker::Worker) gives it back to the queue at its next heartbeat.
//! - Operators read it with `psql -c 'SELECT id, key, state, worker, detail FROM tasks'`.
//!
//! This file holds the backend's calls, one transaction each; `schema` the SQL text they share
//! (the tables, the server's clock, the dispatch choice); the connection (URL parameters, TLS,
//! listening, prepared statements, bounds, errors) is the crate's `postgres` module's, which the
//! PostgreSQL lock store shares.

mod schema;

use super::{
    outcome_parts, CancelReason, Cancelled, ClaimRequest, Enqueued, KeyCount, KeyLease, NewTask,
    Outcome, QueueBackend, RawTask, Recovered, Status, Task, TaskEntry, TaskState, WorkerInfo,
    CANCEL_NONE, CANCEL_REQUESTED, CANCEL_TIMEOUT, COLUMNS,
};
use crate::error::{Error, Result};
use crate::pg::conn::{bounded, pg_err, Conn, OnNotice, Prepared, Target};
use schema::{NOW, PICK, SCHEMA};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, MutexGuard, Notify};
use tokio_postgres::{Client, GenericClient, Row, Transaction};

/// The queue in a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgQueue {
    client: Arc<Mutex<Conn>>,
    /// A call ran out of time on the connection: the next call makes a new one.
    stale: Arc<AtomicBool>,
    target: Target,
    timeout: Duration,
    notify: Arc<Notify>,
    url: String,
}

/// The channel the queue's changes are notified on.
const CHANNEL: &str = "leasehold_queue";

/// Wakes the queue's waiters on every notification, and when the connection ends.
fn waker(notify: &Arc<Notify>) -> OnNotice {
    let n = notify.clone();
    Arc::new(move |_| n.notify_waiters())
}

fn read_raw(r: &Row) -> std::result::Result<RawTask, tokio_postgres::Error> {
    Ok(RawTask {
        id: r.try_get(0)?,
        key: r.try_get(1)?,
        grp: r.try_get(2)?,
        priority: r.try_get(3)?,
        rank: r.try_get(4)?,
        payload: r.try_get(5)?,
        state: r.try_get(6)?,
        policy: r.try_get(7)?,
        max_attempts: r.try_get(8)?,
        attempts: r.try_get(9)?,
        timeout_ms: r.try_get(10)?,
        enqueued_ms: r.try_get(11)?,
        started_ms: r.try_get(12)?,
        ended_ms: r.try_get(13)?,
        worker: r.try_get(14)?,
        fence: r.try_get(15)?,
        lease_expires_ms: r.try_get(16)?,
        cancel: r.try_get(17)?,
        detail: r.try_get(18)?,
    })
}

fn read_entry(r: &Row) -> TaskEntry {
    match read_raw(r) {
        Ok(raw) => raw.parse(),
        Err(e) => TaskEntry::Corrupt {
            id: r
                .try_get::<_, i64>(0)
                .ok()
                .and_then(|i| u64::try_from(i).ok())
                .unwrap_or(0),
            corrupt: e.to_string(),
        },
    }
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn id_i64(id: u64) -> Result<i64> {
    i64::try_from(id).map_err(|_| Error::NotFound {
        what: format!("task {id}"),
    })
}

/// Frees the slot and the key a task held.
async fn free(
    tx: &Transaction<'_>,
    p: &Prepared,
    id: i64,
) -> std::result::Result<(), tokio_postgres::Error> {
    p.execute(
        tx,
        "UPDATE queue_slots SET task = NULL WHERE task = $1",
        &[&id],
    )
    .await?;
    p.execute(
        tx,
        "UPDATE queue_keys SET running = NULL WHERE running = $1",
        &[&id],
    )
    .await?;
    p.execute(tx, "NOTIFY leasehold_queue", &[]).await?;
    Ok(())
}

async fn get_entry(
    c: &impl GenericClient,
    p: &Prepared,
    id: i64,
) -> std::result::Result<Option<TaskEntry>, tokio_postgres::Error> {
    let sql = format!("SELECT {COLUMNS} FROM tasks WHERE id = $1");
    Ok(p.query_opt(c, &sql, &[&id]).await?.map(|r| read_entry(&r)))
}

impl PgQueue {
    /// Connects, creates the tables if needed and listens for changes.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a URL the driver refuses; [`Error::Unavailable`] when the server
    /// cannot be reached; a store error when the schema cannot be created.
    pub async fn connect(url: &str) -> Result<Self> {
        let target = Target::parse(url)?;
        let (shown, timeout) = (target.shown.clone(), target.timeout);
        let notify = Arc::new(Notify::new());
        let mut client = target.connect(CHANNEL, waker(&notify)).await?;
        let schema = async {
            let tx = client.transaction().await?;
            // One schema creator at a time (CREATE … IF NOT EXISTS races otherwise).
            tx.execute("SELECT pg_advisory_xact_lock(7451830021)", &[])
                .await?;
            tx.batch_execute(SCHEMA).await?;
            tx.commit().await
        };
        bounded(&shown, timeout, schema).await?;
        Ok(PgQueue {
            client: Arc::new(Mutex::new(Conn::new(client))),
            stale: Arc::default(),
            target,
            timeout,
            notify,
            url: shown,
        })
    }

    /// The connection, made again first when the server ended it or a call ran out of time on
    /// it (waking [`changed`](QueueBackend::changed): tasks may have changed meanwhile).
    async fn conn(&self) -> Result<MutexGuard<'_, Conn>> {
        let mut c = self.client.lock().await;
        if c.is_closed() || self.stale.load(Ordering::SeqCst) {
            *c = Conn::new(self.target.connect(CHANNEL, waker(&self.notify)).await?);
            self.stale.store(false, Ordering::SeqCst);
            self.notify.notify_waiters();
        }
        Ok(c)
    }

    /// `call` on the connection, bounded by the queue's timeout; when it runs out, the
    /// connection is dropped at the next call (which rolls back what `call` had not committed).
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        let out = bounded(&self.url, self.timeout, call).await;
        if out.as_ref().is_err_and(Error::is_no_answer) {
            self.stale.store(true, Ordering::SeqCst);
        }
        out
    }
}

#[async_trait::async_trait]
impl QueueBackend for PgQueue {
    async fn enqueue(&self, task: &NewTask) -> Result<Enqueued> {
        let mut out = self.enqueue_batch(std::slice::from_ref(task)).await?;
        out.pop().ok_or_else(|| Error::Store {
            source: None,
            store: self.url.clone(),
            detail: "enqueue returned nothing".into(),
            retryable: false,
        })
    }

    async fn enqueue_batch(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>> {
        for t in tasks {
            t.validate()?;
        }
        let keys: Vec<&str> = tasks.iter().map(|t| t.key.as_str()).collect();
        let groups: Vec<Option<&str>> = tasks.iter().map(|t| t.group.as_deref()).collect();
        let prios: Vec<&str> = tasks.iter().map(|t| t.priority.as_str()).collect();
        let ranks: Vec<i64> = tasks.iter().map(|t| t.priority.rank()).collect();
        let payloads: Vec<&str> = tasks.iter().map(|t| t.payload.as_str()).collect();
        let policies: Vec<&str> = tasks.iter().map(|t| t.policy.name()).collect();
        let attempts: Vec<i64> = tasks
            .iter()
            .map(|t| i64::from(t.policy.max_attempts()))
            .collect();
        let timeouts: Vec<Option<i64>> =
            tasks.iter().map(|t| t.timeout.map(super::ms_i64)).collect();
        let mut c = self.conn().await?;
        let run = async {
            let tx = c.transaction().await?;
            tx.execute(
                "INSERT INTO queue_keys (key) SELECT DISTINCT unnest($1::text[]) ON CONFLICT DO NOTHING",
                &[&keys],
            )
            .await?;
            tx.execute(
                "INSERT INTO queue_groups (grp) SELECT DISTINCT g FROM unnest($1::text[]) AS g \
                 WHERE g IS NOT NULL ON CONFLICT DO NOTHING",
                &[&groups],
            )
            .await?;
            // One statement for the batch; ids come from the sequence in row order.
            let rows = tx
                .query(
                    &format!(
                        "INSERT INTO tasks (key, grp, priority, rank, payload, state, policy, \
                         max_attempts, timeout_ms, enqueued_ms, aged_ms) \
                         SELECT k, g, p, r, pl, 'pending', po, ma, tm, {NOW}, {NOW} \
                         FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], \
                                     $6::text[], $7::int8[], $8::int8[]) WITH ORDINALITY \
                              AS u(k, g, p, r, pl, po, ma, tm, ord) \
                         ORDER BY ord RETURNING id"
                    ),
                    &[
                        &keys, &groups, &prios, &ranks, &payloads, &policies, &attempts, &timeouts,
                    ],
                )
                .await?;
            let mut ids: Vec<i64> = rows
                .iter()
                .map(|r| r.try_get(0))
                .collect::<std::result::Result<_, _>>()?;
            ids.sort_unstable();
            // Each new task's place in its key's line, in one pass over the keys' pending tasks.
            let pos = tx
                .query(
                    "SELECT id, pos FROM (SELECT id, row_number() OVER \
                     (PARTITION BY key ORDER BY rank, id) AS pos FROM tasks \
                     WHERE state = 'pending' AND key = ANY($1)) x WHERE id = ANY($2)",
                    &[&keys, &ids],
                )
                .await?;
            let mut positions = std::collections::HashMap::with_capacity(pos.len());
            for r in pos {
                positions.insert(r.try_get::<_, i64>(0)?, r.try_get::<_, i64>(1)?);
            }
            tx.execute("NOTIFY leasehold_queue", &[]).await?;
            tx.commit().await?;
            Ok(ids
                .iter()
                .map(|id| Enqueued {
                    id: u(*id),
                    position: u(positions.get(id).copied().unwrap_or(1)),
                })
                .collect())
        };
        self.bounded(run).await
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Option<Task>> {
        let mut c = self.conn().await?;
        let max = i64::from(req.max_running);
        let limit = req.group_limit.map(i64::from);
        let ttl = super::ms_i64(req.ttl);
        let p = c.prepared.clone();
        let run = async {
            let tx = c.transaction().await?;
            p.execute(
                &tx,
                "INSERT INTO queue_slots (n) SELECT generate_series(0, $1::bigint - 1) \
                 ON CONFLICT DO NOTHING",
                &[&max],
            )
            .await?;
            let Some(slot) = p
                .query_opt(
                    &tx,
                    "SELECT n FROM queue_slots WHERE n < $1::bigint AND task IS NULL ORDER BY n LIMIT 1 \
                     FOR UPDATE SKIP LOCKED",
                    &[&max],
                )
                .await?
            else {
                tx.commit().await?;
                return Ok(None);
            };
            let slot: i64 = slot.try_get(0)?;
            for _ in 0..16 {
                let Some(pick) = p.query_opt(&tx, PICK, &[&limit]).await? else {
                    break;
                };
                let (id, key): (i64, String) = (pick.try_get(0)?, pick.try_get(1)?);
                let Some(entry) = get_entry(&tx, &p, id).await? else {
                    continue;
                };
                let task = match entry {
                    TaskEntry::Task(t) => t,
                    TaskEntry::Corrupt { corrupt, .. } => {
                        tx.execute(
                            &format!(
                                "UPDATE tasks SET state = 'failed', ended_ms = {NOW}, \
                                 detail = 'corrupt record: ' || $2 WHERE id = $1"
                            ),
                            &[&id, &corrupt],
                        )
                        .await?;
                        continue;
                    }
                };
                if let (Some(limit), Some(g)) = (limit, &task.group) {
                    // Exact under concurrency: one claimer per group at a time recounts.
                    tx.execute("SELECT 1 FROM queue_groups WHERE grp = $1 FOR UPDATE", &[g])
                        .await?;
                    let n: i64 = tx
                        .query_one(
                            "SELECT COUNT(*) FROM tasks WHERE state = 'running' AND grp = $1",
                            &[g],
                        )
                        .await?
                        .try_get(0)?;
                    if n >= limit {
                        break;
                    }
                }
                let changed = p
                    .execute(
                        &tx,
                        &format!(
                            "UPDATE tasks SET state = 'running', worker = $2, attempts = attempts + 1, \
                             started_ms = {NOW}, lease_expires_ms = {NOW} + $3, fence = NULL, cancel = 0 \
                             WHERE id = $1 AND state = 'pending'"
                        ),
                        &[&id, &req.worker, &ttl],
                    )
                    .await?;
                if changed != 1 {
                    continue;
                }
                p.execute(
                    &tx,
                    "UPDATE queue_keys SET running = $2, served = nextval('queue_served') WHERE key = $1",
                    &[&key, &id],
                )
                .await?;
                p.execute(
                    &tx,
                    "UPDATE queue_slots SET task = $2 WHERE n = $1",
                    &[&slot, &id],
                )
                .await?;
                let out = match get_entry(&tx, &p, id).await? {
                    Some(TaskEntry::Task(t)) => Some(t),
                    _ => None,
                };
                tx.commit().await?;
                return Ok(out);
            }
            tx.commit().await?;
            Ok(None)
        };
        self.bounded(run).await
    }

    async fn unclaim(&self, id: u64, worker: &str) -> Result<bool> {
        let id = id_i64(id)?;
        let mut c = self.conn().await?;
        let p = c.prepared.clone();
        let run = async {
            let tx = c.transaction().await?;
            let n = p
                .execute(
                    &tx,
                    "UPDATE tasks SET state = 'pending', worker = NULL, attempts = attempts - 1, \
                     lease_expires_ms = NULL, started_ms = NULL \
                     WHERE id = $1 AND worker = $2 AND state = 'running'",
                    &[&id, &worker],
                )
                .await?;
            if n == 1 {
                free(&tx, &p, id).await?;
            }
            tx.commit().await?;
            Ok(n == 1)
        };
        self.bounded(run).await
    }

    async fn started(&self, id: u64, worker: &str, fence: u64) -> Result<bool> {
        let id = id_i64(id)?;
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        let c = self.conn().await?;
        let n = self
            .bounded(c.prepared.execute(
                &**c,
                "UPDATE tasks SET fence = $3 WHERE id = $1 AND worker = $2 AND state = 'running'",
                &[&id, &worker, &fence],
            ))
            .await?;
        Ok(n == 1)
    }

    async fn heartbeat(
        &self,
        worker: &str,
        slots: u32,
        ttl: Duration,
        running: &[u64],
    ) -> Result<Vec<(u64, CancelReason)>> {
        let ttl = super::ms_i64(ttl);
        let running = super::ids_i64(running);
        let slots = i64::from(slots);
        let mut c = self.conn().await?;
        let p = c.prepared.clone();
        let run = async {
            let tx = c.transaction().await?;
            p.execute(
                &tx,
                &format!(
                    "INSERT INTO queue_workers (id, slots, expires_ms) VALUES ($1, $2, {NOW} + $3) \
                     ON CONFLICT (id) DO UPDATE SET slots = $2, expires_ms = {NOW} + $3"
                ),
                &[&worker, &slots, &ttl],
            )
            .await?;
            p.execute(
                &tx,
                &format!(
                    "UPDATE tasks SET lease_expires_ms = {NOW} + $2 \
                     WHERE id = ANY($3::bigint[]) AND worker = $1 AND state = 'running'"
                ),
                &[&worker, &ttl, &running],
            )
            .await?;
            let rows = p
                .query(
                    &tx,
                    "SELECT id, cancel FROM tasks WHERE worker = $1 AND state = 'running' AND cancel <> 0",
                    &[&worker],
                )
                .await?;
            tx.commit().await?;
            let mut out = Vec::new();
            for r in rows {
                let (id, code): (i64, i64) = (r.try_get(0)?, r.try_get(1)?);
                let why = if code == CANCEL_TIMEOUT {
                    CancelReason::Timeout
                } else {
                    CancelReason::Cancelled
                };
                out.push((u(id), why));
            }
            Ok(out)
        };
        self.bounded(run).await
    }

    async fn claims(&self, worker: &str) -> Result<Vec<(u64, bool)>> {
        let c = self.conn().await?;
        let rows = self
            .bounded(c.query(
                "SELECT id, fence IS NOT NULL FROM tasks WHERE worker = $1 AND state = 'running' \
                 ORDER BY id",
                &[&worker],
            ))
            .await?;
        rows.iter()
            .map(|r| Ok((u(r.try_get::<_, i64>(0)?), r.try_get::<_, bool>(1)?)))
            .collect::<std::result::Result<_, tokio_postgres::Error>>()
            .map_err(|e| pg_err(&self.url, e))
    }

    async fn finish(&self, id: u64, worker: &str, outcome: &Outcome) -> Result<bool> {
        let id = id_i64(id)?;
        let (state, detail) = outcome_parts(outcome);
        let mut c = self.conn().await?;
        let p = c.prepared.clone();
        let run = async {
            let tx = c.transaction().await?;
            let n = p
                .execute(
                    &tx,
                    &format!(
                        "UPDATE tasks SET state = $3, detail = $4, ended_ms = {NOW}, cancel = 0 \
                         WHERE id = $1 AND worker = $2 AND state = 'running'"
                    ),
                    &[&id, &worker, &state, &detail],
                )
                .await?;
            if n == 1 {
                free(&tx, &p, id).await?;
            }
            tx.commit().await?;
            Ok(n == 1)
        };
        self.bounded(run).await
    }

    async fn cancel(&self, id: u64) -> Result<Cancelled> {
        let raw = id;
        let id = id_i64(id)?;
        let mut c = self.conn().await?;
        let run = async {
            let tx = c.transaction().await?;
            let Some(row) = tx
                .query_opt("SELECT state FROM tasks WHERE id = $1 FOR UPDATE", &[&id])
                .await?
            else {
                tx.commit().await?;
                return Ok(None);
            };
            let state: String = row.try_get(0)?;
            let out = match TaskState::parse(&state) {
                Some(TaskState::Pending) | None => {
                    tx.execute(
                        &format!(
                            "UPDATE tasks SET state = 'cancelled', ended_ms = {NOW}, \
                             detail = 'cancelled before it ran' WHERE id = $1"
                        ),
                        &[&id],
                    )
                    .await?;
                    Cancelled::Cancelled
                }
                Some(TaskState::Running) => {
                    tx.execute(
                        "UPDATE tasks SET cancel = $2 WHERE id = $1",
                        &[&id, &CANCEL_REQUESTED],
                    )
                    .await?;
                    Cancelled::Requested
                }
                Some(s) => Cancelled::AlreadyEnded(s),
            };
            tx.commit().await?;
            Ok(Some(out))
        };
        self.bounded(run).await?.ok_or_else(|| Error::NotFound {
            what: format!("task {raw}"),
        })
    }

    async fn get(&self, id: u64) -> Result<TaskEntry> {
        let raw = id;
        let id = id_i64(id)?;
        let c = self.conn().await?;
        self.bounded(get_entry(&**c, &c.prepared, id))
            .await?
            .ok_or_else(|| Error::NotFound {
                what: format!("task {raw}"),
            })
    }

    async fn list(&self, all: bool, limit: u64) -> Result<Vec<TaskEntry>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let filter = if all {
            ""
        } else {
            "WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
        };
        let c = self.conn().await?;
        let query = format!("SELECT {COLUMNS} FROM tasks {filter} ORDER BY id LIMIT $1");
        let rows = self.bounded(c.query(&query, &[&limit])).await?;
        Ok(rows.iter().map(read_entry).collect())
    }

    async fn status(&self) -> Result<Status> {
        let c = self.conn().await?;
        self.bounded(status(&c)).await
    }

    async fn recover(&self, aging: Duration) -> Result<Recovered> {
        let aging = super::ms_i64(aging).max(1);
        let mut c = self.conn().await?;
        let p = c.prepared.clone();
        let run = async {
            let tx = c.transaction().await?;
            let mut out = Recovered::default();
            let dead = tx
                .query(
                    &format!(
                        "SELECT id, policy, attempts, max_attempts, worker FROM tasks \
                         WHERE state = 'running' AND lease_expires_ms < {NOW} FOR UPDATE SKIP LOCKED"
                    ),
                    &[],
                )
                .await?;
            for r in dead {
                let (id, policy, attempts, max): (i64, String, i64, i64) =
                    (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?);
                let worker: String = r.try_get::<_, Option<String>>(4)?.unwrap_or_default();
                if policy == "at-least-once" && attempts < max {
                    tx.execute(
                        "UPDATE tasks SET state = 'pending', worker = NULL, lease_expires_ms = NULL, \
                         cancel = 0, detail = $2 WHERE id = $1",
                        &[
                            &id,
                            &format!(
                                "requeued: worker {worker} lost during attempt {attempts} of {max}"
                            ),
                        ],
                    )
                    .await?;
                    out.requeued.push(u(id));
                } else {
                    let why = if policy == "at-least-once" {
                        format!(
                            "worker {worker} lost during the last attempt ({attempts} of {max})"
                        )
                    } else {
                        format!("worker {worker} lost; at-most-once: not run again")
                    };
                    tx.execute(
                        &format!(
                            "UPDATE tasks SET state = 'failed', ended_ms = {NOW}, cancel = 0, \
                             detail = $2 WHERE id = $1"
                        ),
                        &[&id, &why],
                    )
                    .await?;
                    out.failed.push(u(id));
                }
                free(&tx, &p, id).await?;
            }
            let rows = tx
                .query(
                    &format!(
                        "UPDATE tasks SET cancel = $1 WHERE state = 'running' AND cancel = $2 \
                         AND timeout_ms IS NOT NULL AND timeout_ms < {NOW} - started_ms RETURNING id"
                    ),
                    &[&CANCEL_TIMEOUT, &CANCEL_NONE],
                )
                .await?;
            for r in rows {
                out.timed_out.push(u(r.try_get(0)?));
            }
            out.aged = tx
                .execute(
                    &format!(
                        "UPDATE tasks SET rank = rank - 1, aged_ms = {NOW} \
                         WHERE state = 'pending' AND rank > 0 AND aged_ms <= {NOW} - $1"
                    ),
                    &[&aging],
                )
                .await?;
            tx.execute(
                &format!("DELETE FROM queue_workers WHERE expires_ms < {NOW}"),
                &[],
            )
            .await?;
            tx.commit().await?;
            Ok(out)
        };
        self.bounded(run).await
    }

    async fn cleanup(&self, older_than: Duration) -> Result<u64> {
        let older = super::ms_i64(older_than);
        let batch = i64::try_from(super::CLEANUP_BATCH).unwrap_or(i64::MAX);
        let mut deleted = 0;
        loop {
            let c = self.conn().await?;
            let n = self
                .bounded(c.execute(
                    &format!(
                        "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks \
                         WHERE state IN ('succeeded', 'failed', 'cancelled') \
                         AND ended_ms <= {NOW} - $1 LIMIT $2)"
                    ),
                    &[&older, &batch],
                ))
                .await?;
            deleted += n;
            if n < super::CLEANUP_BATCH {
                break;
            }
        }
        // Keys with no task left. The table lock waits for every enqueue that wrote the key
        // table (each holds it until its commit, even when the key's row was there already) and
        // holds off new ones, so no key's row goes from under a task being added; rows a
        // claimer locked are skipped (they have tasks), so nobody waits on anybody in a cycle.
        let mut c = self.conn().await?;
        let run = async {
            let tx = c.transaction().await?;
            tx.batch_execute("LOCK TABLE queue_keys IN SHARE ROW EXCLUSIVE MODE")
                .await?;
            tx.execute(
                "DELETE FROM queue_keys WHERE key IN (SELECT k.key FROM queue_keys k \
                 WHERE k.running IS NULL AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.key = k.key) \
                 FOR UPDATE SKIP LOCKED)",
                &[],
            )
            .await?;
            tx.commit().await
        };
        self.bounded(run).await?;
        Ok(deleted)
    }

    async fn deregister(&self, worker: &str) -> Result<()> {
        let c = self.conn().await?;
        self.bounded(c.execute("DELETE FROM queue_workers WHERE id = $1", &[&worker]))
            .await?;
        Ok(())
    }

    async fn changed(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.notify.notified()).await;
    }
}

async fn status(c: &Client) -> std::result::Result<Status, tokio_postgres::Error> {
    let mut s = Status::default();
    for r in c
        .query(
            "SELECT state, rank, COUNT(*) FROM tasks GROUP BY state, rank",
            &[],
        )
        .await?
    {
        let (state, rank, n): (String, i64, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        s.count(&state, rank, u(n));
    }
    let counts = |rows: Vec<Row>| -> std::result::Result<Vec<KeyCount>, tokio_postgres::Error> {
        rows.iter()
            .map(|r| {
                Ok(KeyCount {
                    name: r.try_get(0)?,
                    pending: u(r.try_get(1)?),
                    running: u(r.try_get(2)?),
                })
            })
            .collect()
    };
    s.groups = counts(
        c.query(
            "SELECT grp, COUNT(*) FILTER (WHERE state = 'pending'), COUNT(*) FILTER (WHERE state = 'running') \
             FROM tasks WHERE state IN ('pending', 'running') AND grp IS NOT NULL GROUP BY grp ORDER BY grp",
            &[],
        )
        .await?,
    )?;
    s.keys = counts(
        c.query(
            &format!(
                "SELECT key, COUNT(*) FILTER (WHERE state = 'pending') AS p, \
                 COUNT(*) FILTER (WHERE state = 'running') AS r FROM tasks \
                 WHERE state IN ('pending', 'running') GROUP BY key ORDER BY r DESC, p DESC, key LIMIT {}",
                Status::KEYS_SHOWN
            ),
            &[],
        )
        .await?,
    )?;
    s.keys_total = u(c
        .query_one(
            "SELECT COUNT(DISTINCT key) FROM tasks WHERE state IN ('pending', 'running')",
            &[],
        )
        .await?
        .try_get(0)?);
    for r in c
        .query(
            "SELECT key, id, worker, fence, started_ms, lease_expires_ms FROM tasks \
             WHERE state = 'running' ORDER BY key",
            &[],
        )
        .await?
    {
        s.leases.push(KeyLease {
            key: r.try_get(0)?,
            task: u(r.try_get(1)?),
            holder: r.try_get::<_, Option<String>>(2)?.unwrap_or_default(),
            fence: r.try_get::<_, Option<i64>>(3)?.map(u),
            acquired_ms: u(r.try_get::<_, Option<i64>>(4)?.unwrap_or(0)),
            expires_ms: u(r.try_get::<_, Option<i64>>(5)?.unwrap_or(0)),
        });
    }
    for r in c
        .query(
            &format!(
                "SELECT id, slots, expires_ms FROM queue_workers WHERE expires_ms >= {NOW} ORDER BY id"
            ),
            &[],
        )
        .await?
    {
        s.workers.push(WorkerInfo {
            id: r.try_get(0)?,
            slots: u32::try_from(r.try_get::<_, i64>(1)?).unwrap_or(0),
            expires_ms: u(r.try_get(2)?),
        });
    }
    s.slots = s
        .workers
        .iter()
        .map(|w| u64::from(w.slots))
        .max()
        .unwrap_or(0);
    Ok(s)
}
