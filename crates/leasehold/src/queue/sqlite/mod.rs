//! The queue in a local SQLite database (`sqlite:///path/queue.db`), the embedded default.
//!
//! - WAL journal and a 10 s busy timeout: several worker and CLI processes on one host share the
//!   file; every decision is one `BEGIN IMMEDIATE` transaction (one writer at a time).
//! - Calls run on tokio's blocking pool; one connection per [`SqliteQueue`].
//! - [`changed`](QueueBackend::changed) wakes when any process writes the database: inotify on
//!   its directory (writes to `queue.db` and its WAL), so an idle worker starts a task enqueued
//!   by another process within about a millisecond; on a busy queue at most every 5 ms (not at
//!   every commit). The watch is made by the first `changed`. Where inotify cannot be had (no
//!   instance or watch left), it polls every 50 ms.
//! - Operators can read it with `sqlite3 queue.db 'SELECT id, key, state, detail FROM tasks'`.

use super::{
    ms_i64, now_i64, outcome_parts, CancelReason, Cancelled, ClaimRequest, Enqueued, KeyCount,
    KeyLease, NewTask, Outcome, QueueBackend, RawTask, Recovered, Status, Task, TaskEntry,
    WorkerInfo, CANCEL_NONE, CANCEL_REQUESTED, CANCEL_TIMEOUT, COLUMNS,
};
use crate::error::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  key TEXT NOT NULL,
  grp TEXT,
  priority TEXT NOT NULL,
  rank INTEGER NOT NULL,
  payload TEXT NOT NULL,
  state TEXT NOT NULL,
  policy TEXT NOT NULL,
  max_attempts INTEGER NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  timeout_ms INTEGER,
  enqueued_ms INTEGER NOT NULL,
  aged_ms INTEGER NOT NULL,
  started_ms INTEGER,
  ended_ms INTEGER,
  worker TEXT,
  fence INTEGER,
  lease_expires_ms INTEGER,
  cancel INTEGER NOT NULL DEFAULT 0,
  detail TEXT
);
CREATE INDEX IF NOT EXISTS tasks_by_key ON tasks (key, state, rank, id);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state, grp);
CREATE TABLE IF NOT EXISTS queue_keys (key TEXT PRIMARY KEY, served INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS queue_workers (
  id TEXT PRIMARY KEY, slots INTEGER NOT NULL, expires_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO queue_meta (name, value) VALUES ('served', 0);
";

/// The dispatch choice: the head (priority, then arrival) of every key with nothing running,
/// best effective priority first, then the key served least recently, then arrival.
const PICK: &str = "
SELECT t.id FROM queue_keys k
JOIN tasks t ON t.id = (SELECT h.id FROM tasks h WHERE h.key = k.key AND h.state = 'pending'
                        ORDER BY h.rank, h.id LIMIT 1)
WHERE NOT EXISTS (SELECT 1 FROM tasks r WHERE r.key = k.key AND r.state = 'running')
  AND (?1 IS NULL OR t.grp IS NULL
       OR (SELECT COUNT(*) FROM tasks g WHERE g.state = 'running' AND g.grp = t.grp) < ?1)
ORDER BY t.rank, k.served, t.id LIMIT 1";

/// The queue in one SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteQueue {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    notify: Arc<Notify>,
    /// Writes by any process, watched from the first [`QueueBackend::changed`] on (`None`
    /// inside when inotify could not be had).
    wakeups: Arc<tokio::sync::OnceCell<Option<wakeups::Wakeups>>>,
}

fn sql_err(e: rusqlite::Error) -> Error {
    let busy = matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    Error::Store {
        source: None,
        store: "sqlite queue".into(),
        detail: e.to_string(),
        retryable: busy,
    }
    .caused_by(e)
}

fn read_raw(row: &Row<'_>) -> rusqlite::Result<RawTask> {
    Ok(RawTask {
        id: row.get(0)?,
        key: row.get(1)?,
        grp: row.get(2)?,
        priority: row.get(3)?,
        rank: row.get(4)?,
        payload: row.get(5)?,
        state: row.get(6)?,
        policy: row.get(7)?,
        max_attempts: row.get(8)?,
        attempts: row.get(9)?,
        timeout_ms: row.get(10)?,
        enqueued_ms: row.get(11)?,
        started_ms: row.get(12)?,
        ended_ms: row.get(13)?,
        worker: row.get(14)?,
        fence: row.get(15)?,
        lease_expires_ms: row.get(16)?,
        cancel: row.get(17)?,
        detail: row.get(18)?,
    })
}

/// A row as an entry: a column of the wrong type makes it corrupt, not an error.
fn read_entry(row: &Row<'_>) -> rusqlite::Result<TaskEntry> {
    Ok(match read_raw(row) {
        Ok(raw) => raw.parse(),
        Err(e) => TaskEntry::Corrupt {
            id: row
                .get::<_, i64>(0)
                .ok()
                .and_then(|i| u64::try_from(i).ok())
                .unwrap_or(0),
            corrupt: e.to_string(),
        },
    })
}

fn id_i64(id: u64) -> Result<i64> {
    i64::try_from(id).map_err(|_| Error::NotFound {
        what: format!("task {id}"),
    })
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl SqliteQueue {
    /// Opens (creating if needed) the database at `path`, its parent directories too, with the
    /// default mode: the database, its WAL and shared-memory files 0600 and the directories it
    /// creates 0700, whatever the umask ([`SqliteQueue::open_with_mode`] to share with a group).
    ///
    /// Whoever can write the database can enqueue commands that the workers run, as the workers'
    /// user: keep it as private as the workers' account.
    ///
    /// # Errors
    /// [`Error::Io`] when the directory or the file cannot be created; a store error when the file
    /// cannot be opened as a database.
    pub async fn open(path: impl Into<PathBuf>) -> Result<Self> {
        Self::open_with_mode(path, crate::fsmode::DEFAULT).await
    }

    /// As [`SqliteQueue::open`], creating a new database with file mode `mode` (its WAL and
    /// shared-memory files get the same; directories created get 0700 plus group/other search
    /// where `mode` grants read, as the file store's). An existing database keeps its mode.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::os::unix::fs::PermissionsExt;
    /// let tmp = tempfile::tempdir().unwrap();
    /// let path = tmp.path().join("shared/queue.db");
    /// let _queue = leasehold::queue::sqlite::SqliteQueue::open_with_mode(&path, 0o640).await?;
    /// let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    /// assert_eq!(mode(&path), 0o640);
    /// assert_eq!(mode(&tmp.path().join("shared")), 0o750);
    /// # Ok::<(), leasehold::Error>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a mode without owner read/write (or above 0777); as
    /// [`SqliteQueue::open`].
    pub async fn open_with_mode(path: impl Into<PathBuf>, mode: u32) -> Result<Self> {
        let dir_mode = crate::fsmode::dir_mode_for(mode)?;
        let path = path.into();
        let p = path.clone();
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(dir_mode)
                    .create(dir)
                    .map_err(|e| Error::io("create queue directory", dir.display(), e))?;
            }
            // The database file is made here with its mode (the umask may only narrow it, so it
            // is set again); SQLite gives its WAL and shared-memory files the database's mode.
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&p)
            {
                Ok(file) => file
                    .set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(|e| Error::io("set the mode of", p.display(), e))?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io("create queue database", p.display(), e)),
            }
            let conn = Connection::open(&p).map_err(sql_err)?;
            conn.busy_timeout(Duration::from_secs(10))
                .map_err(sql_err)?;
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(sql_err)?;
            conn.pragma_update(None, "synchronous", "NORMAL")
                .map_err(sql_err)?;
            // Only a new database gets its schema: creating it takes the write lock (its last
            // statement inserts), which a reader of an existing queue (`queue ls` while a worker
            // is stopped mid-transaction) must not wait for.
            let ready = conn
                .query_row("SELECT 1 FROM queue_meta WHERE name = 'served'", [], |_| {
                    Ok(())
                })
                .is_ok();
            if !ready {
                conn.execute_batch(SCHEMA).map_err(sql_err)?;
            }
            Ok(conn)
        })
        .await
        .map_err(|e| Error::Store {
            source: None,
            store: "sqlite queue".into(),
            detail: format!("open task failed: {e}"),
            retryable: false,
        })??;
        Ok(SqliteQueue {
            conn: Arc::new(Mutex::new(conn)),
            path,
            notify: Arc::new(Notify::new()),
            wakeups: Arc::default(),
        })
    }

    /// Opens `sqlite:///absolute/path/queue.db[?mode=0640]` (or `sqlite://relative/path`): `mode`
    /// is the file mode of a new database (octal, default 0600; see
    /// [`SqliteQueue::open_with_mode`]).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] without a path, with an unknown parameter or a bad mode; as
    /// [`SqliteQueue::open`].
    pub async fn from_url(url: &str) -> Result<Self> {
        let bad = |reason: String| Error::InvalidUrl {
            url: url.into(),
            reason,
        };
        let rest = url.split_once("://").map(|(_, p)| p).unwrap_or("");
        let rest = rest.split('#').next().unwrap_or("");
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(bad("expected sqlite:///path/to/queue.db".into()));
        }
        let mut mode = crate::fsmode::DEFAULT;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("mode", v)) => mode = crate::fsmode::parse(v).map_err(bad)?,
                _ => return Err(bad(format!("unknown parameter {pair:?} (known: mode)"))),
            }
        }
        Self::open_with_mode(path, mode).await
    }

    /// The database file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| Error::Store {
            source: None,
            store: "sqlite queue".into(),
            detail: format!("queue call failed: {e}"),
            retryable: false,
        })?
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction.
    async fn tx<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let out = self
            .with(move |c| {
                let tx = c
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sql_err)?;
                let out = f(&tx).map_err(sql_err)?;
                tx.commit().map_err(sql_err)?;
                Ok(out)
            })
            .await?;
        self.notify.notify_waiters();
        Ok(out)
    }
}

fn get_entry(tx: &Connection, id: i64) -> rusqlite::Result<Option<TaskEntry>> {
    tx.query_row(
        &format!("SELECT {COLUMNS} FROM tasks WHERE id = ?1"),
        [id],
        read_entry,
    )
    .optional()
}

#[async_trait::async_trait]
impl QueueBackend for SqliteQueue {
    async fn enqueue(&self, task: &NewTask) -> Result<Enqueued> {
        let mut out = self.enqueue_batch(std::slice::from_ref(task)).await?;
        out.pop().ok_or_else(|| Error::Store {
            source: None,
            store: "sqlite queue".into(),
            detail: "enqueue returned nothing".into(),
            retryable: false,
        })
    }

    async fn enqueue_batch(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>> {
        for t in tasks {
            t.validate()?;
        }
        let tasks = tasks.to_vec();
        self.tx(move |tx| {
            let now = now_i64();
            let mut key_stmt =
                tx.prepare_cached("INSERT OR IGNORE INTO queue_keys (key, served) VALUES (?1, 0)")?;
            let mut ins = tx.prepare_cached(
                "INSERT INTO tasks (key, grp, priority, rank, payload, state, policy, max_attempts, \
                 timeout_ms, enqueued_ms, aged_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?9, ?9)",
            )?;
            let mut ahead = tx.prepare_cached(
                "SELECT COUNT(*) FROM tasks WHERE key = ?1 AND state = 'pending' \
                 AND (rank < ?2 OR (rank = ?2 AND id < ?3))",
            )?;
            let mut out = Vec::with_capacity(tasks.len());
            for t in &tasks {
                key_stmt.execute([&t.key])?;
                ins.execute(params![
                    t.key,
                    t.group,
                    t.priority.as_str(),
                    t.priority.rank(),
                    t.payload,
                    t.policy.name(),
                    t.policy.max_attempts(),
                    t.timeout.map(ms_i64),
                    now
                ])?;
                let id = tx.last_insert_rowid();
                let n: i64 =
                    ahead.query_row(params![t.key, t.priority.rank(), id], |r| r.get(0))?;
                out.push(Enqueued {
                    id: u(id),
                    position: u(n) + 1,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Option<Task>> {
        let req = req.clone();
        self.tx(move |tx| {
            let running: i64 = tx.query_row(
                "SELECT COUNT(*) FROM tasks WHERE state = 'running'",
                [],
                |r| r.get(0),
            )?;
            if running >= i64::from(req.max_running) {
                return Ok(None);
            }
            let limit = req.group_limit.map(i64::from);
            loop {
                let Some(id) = tx
                    .query_row(PICK, params![limit], |r| r.get::<_, i64>(0))
                    .optional()?
                else {
                    return Ok(None);
                };
                let now = now_i64();
                let Some(entry) = get_entry(tx, id)? else {
                    return Ok(None);
                };
                if let TaskEntry::Corrupt { corrupt, .. } = entry {
                    tx.execute(
                        "UPDATE tasks SET state = 'failed', ended_ms = ?2, \
                         detail = 'corrupt record: ' || ?3 WHERE id = ?1",
                        params![id, now, corrupt],
                    )?;
                    continue;
                }
                tx.execute(
                    "UPDATE tasks SET state = 'running', worker = ?2, attempts = attempts + 1, \
                     started_ms = ?3, lease_expires_ms = ?4, fence = NULL, cancel = 0 WHERE id = ?1",
                    params![id, req.worker, now, now.saturating_add(ms_i64(req.ttl))],
                )?;
                tx.execute(
                    "UPDATE queue_meta SET value = value + 1 WHERE name = 'served'",
                    [],
                )?;
                tx.execute(
                    "UPDATE queue_keys SET served = (SELECT value FROM queue_meta WHERE name = 'served') \
                     WHERE key = (SELECT key FROM tasks WHERE id = ?1)",
                    [id],
                )?;
                return Ok(match get_entry(tx, id)? {
                    Some(TaskEntry::Task(t)) => Some(t),
                    _ => None,
                });
            }
        })
        .await
    }

    async fn unclaim(&self, id: u64, worker: &str) -> Result<bool> {
        let (id, worker) = (id_i64(id)?, worker.to_owned());
        self.tx(move |tx| {
            Ok(tx.execute(
                "UPDATE tasks SET state = 'pending', worker = NULL, attempts = attempts - 1, \
                 lease_expires_ms = NULL, started_ms = NULL WHERE id = ?1 AND worker = ?2 \
                 AND state = 'running'",
                params![id, worker],
            )? == 1)
        })
        .await
    }

    async fn started(&self, id: u64, worker: &str, fence: u64) -> Result<bool> {
        let (id, worker) = (id_i64(id)?, worker.to_owned());
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        self.tx(move |tx| {
            Ok(tx.execute(
                "UPDATE tasks SET fence = ?3 WHERE id = ?1 AND worker = ?2 AND state = 'running'",
                params![id, worker, fence],
            )? == 1)
        })
        .await
    }

    async fn heartbeat(
        &self,
        worker: &str,
        slots: u32,
        ttl: Duration,
        running: &[u64],
    ) -> Result<Vec<(u64, CancelReason)>> {
        let worker = worker.to_owned();
        let running = super::ids_i64(running);
        self.tx(move |tx| {
            let until = now_i64().saturating_add(ms_i64(ttl));
            tx.execute(
                "INSERT INTO queue_workers (id, slots, expires_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (id) DO UPDATE SET slots = ?2, expires_ms = ?3",
                params![worker, slots, until],
            )?;
            for id in &running {
                tx.execute(
                    "UPDATE tasks SET lease_expires_ms = ?3 \
                     WHERE id = ?1 AND worker = ?2 AND state = 'running'",
                    params![id, worker, until],
                )?;
            }
            let mut stmt = tx.prepare(
                "SELECT id, cancel FROM tasks WHERE worker = ?1 AND state = 'running' AND cancel <> 0",
            )?;
            let rows = stmt.query_map([&worker], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (id, code) = row?;
                let why = if code == CANCEL_TIMEOUT {
                    CancelReason::Timeout
                } else {
                    CancelReason::Cancelled
                };
                out.push((u(id), why));
            }
            Ok(out)
        })
        .await
    }

    async fn claims(&self, worker: &str) -> Result<Vec<(u64, bool)>> {
        let worker = worker.to_owned();
        // A read, as `get` and `list` are: it never takes the write lock.
        self.with(move |c| {
            let mut stmt = c
                .prepare(
                    "SELECT id, fence IS NOT NULL FROM tasks WHERE worker = ?1 AND state = 'running' \
                     ORDER BY id",
                )
                .map_err(sql_err)?;
            let rows = stmt
                .query_map([&worker], |r| Ok((u(r.get::<_, i64>(0)?), r.get::<_, bool>(1)?)))
                .map_err(sql_err)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql_err)
        })
        .await
    }

    async fn finish(&self, id: u64, worker: &str, outcome: &Outcome) -> Result<bool> {
        let (id, worker) = (id_i64(id)?, worker.to_owned());
        let (state, detail) = outcome_parts(outcome);
        let detail = detail.map(str::to_owned);
        self.tx(move |tx| {
            Ok(tx.execute(
                "UPDATE tasks SET state = ?3, detail = ?4, ended_ms = ?5, cancel = 0 \
                 WHERE id = ?1 AND worker = ?2 AND state = 'running'",
                params![id, worker, state, detail, now_i64()],
            )? == 1)
        })
        .await
    }

    async fn cancel(&self, id: u64) -> Result<Cancelled> {
        let raw = id;
        let id = id_i64(id)?;
        let out = self
            .tx(move |tx| {
                let Some(entry) = get_entry(tx, id)? else {
                    return Ok(None);
                };
                let state = match entry {
                    TaskEntry::Task(t) => t.state,
                    TaskEntry::Corrupt { .. } => {
                        tx.execute(
                            "UPDATE tasks SET state = 'cancelled', ended_ms = ?2, \
                             detail = 'cancelled (corrupt record)' WHERE id = ?1",
                            params![id, now_i64()],
                        )?;
                        return Ok(Some(Cancelled::Cancelled));
                    }
                };
                Ok(Some(match state {
                    super::TaskState::Pending => {
                        tx.execute(
                            "UPDATE tasks SET state = 'cancelled', ended_ms = ?2, \
                             detail = 'cancelled before it ran' WHERE id = ?1",
                            params![id, now_i64()],
                        )?;
                        Cancelled::Cancelled
                    }
                    super::TaskState::Running => {
                        tx.execute(
                            "UPDATE tasks SET cancel = ?2 WHERE id = ?1",
                            params![id, CANCEL_REQUESTED],
                        )?;
                        Cancelled::Requested
                    }
                    s => Cancelled::AlreadyEnded(s),
                }))
            })
            .await?;
        out.ok_or_else(|| Error::NotFound {
            what: format!("task {raw}"),
        })
    }

    async fn get(&self, id: u64) -> Result<TaskEntry> {
        let raw = id;
        let id = id_i64(id)?;
        self.with(move |c| get_entry(c, id).map_err(sql_err))
            .await?
            .ok_or_else(|| Error::NotFound {
                what: format!("task {raw}"),
            })
    }

    async fn list(&self, all: bool, limit: u64) -> Result<Vec<TaskEntry>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |c| {
            let filter = if all {
                ""
            } else {
                "WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
            };
            let mut stmt = c
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM tasks {filter} ORDER BY id LIMIT ?1"
                ))
                .map_err(sql_err)?;
            let rows = stmt.query_map([limit], read_entry).map_err(sql_err)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(sql_err)
        })
        .await
    }

    async fn status(&self) -> Result<Status> {
        self.with(|c| status(c).map_err(sql_err)).await
    }

    async fn recover(&self, aging: Duration) -> Result<Recovered> {
        let aging = ms_i64(aging).max(1);
        self.tx(move |tx| {
            let now = now_i64();
            let mut out = Recovered::default();
            let dead: Vec<(i64, String, i64, i64, Option<String>)> = {
                let mut stmt = tx.prepare(
                    "SELECT id, policy, attempts, max_attempts, worker FROM tasks \
                     WHERE state = 'running' AND lease_expires_ms < ?1",
                )?;
                let rows = stmt.query_map([now], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for (id, policy, attempts, max, worker) in dead {
                let worker = worker.unwrap_or_default();
                if policy == "at-least-once" && attempts < max {
                    tx.execute(
                        "UPDATE tasks SET state = 'pending', worker = NULL, lease_expires_ms = NULL, \
                         cancel = 0, detail = ?2 WHERE id = ?1",
                        params![
                            id,
                            format!("requeued: worker {worker} lost during attempt {attempts} of {max}")
                        ],
                    )?;
                    out.requeued.push(u(id));
                } else {
                    let why = if policy == "at-least-once" {
                        format!("worker {worker} lost during the last attempt ({attempts} of {max})")
                    } else {
                        format!("worker {worker} lost; at-most-once: not run again")
                    };
                    tx.execute(
                        "UPDATE tasks SET state = 'failed', ended_ms = ?2, cancel = 0, detail = ?3 \
                         WHERE id = ?1",
                        params![id, now, why],
                    )?;
                    out.failed.push(u(id));
                }
            }
            {
                let mut stmt = tx.prepare(
                    "UPDATE tasks SET cancel = ?2 WHERE state = 'running' AND cancel = ?3 \
                     AND timeout_ms IS NOT NULL AND timeout_ms < ?1 - started_ms RETURNING id",
                )?;
                let rows = stmt.query_map(params![now, CANCEL_TIMEOUT, CANCEL_NONE], |r| {
                    r.get::<_, i64>(0)
                })?;
                for id in rows {
                    out.timed_out.push(u(id?));
                }
            }
            out.aged = u(i64::try_from(tx.execute(
                "UPDATE tasks SET rank = rank - 1, aged_ms = ?1 \
                 WHERE state = 'pending' AND rank > 0 AND aged_ms <= ?1 - ?2",
                params![now, aging],
            )?)
            .unwrap_or(0));
            tx.execute(
                "DELETE FROM queue_workers WHERE expires_ms < ?1",
                [now],
            )?;
            Ok(out)
        })
        .await
    }

    async fn cleanup(&self, older_than: Duration) -> Result<u64> {
        let older = super::ms_i64(older_than);
        let batch = i64::try_from(super::CLEANUP_BATCH).unwrap_or(i64::MAX);
        let mut deleted = 0;
        loop {
            let n = self
                .tx(move |tx| {
                    // Judged when the write lock is held, not when the call began: a cleanup that
                    // waited behind busy writers still deletes what ended while it waited.
                    let cutoff = now_i64().saturating_sub(older);
                    tx.execute(
                        "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks \
                         WHERE state IN ('succeeded', 'failed', 'cancelled') AND ended_ms <= ?1 \
                         LIMIT ?2)",
                        rusqlite::params![cutoff, batch],
                    )
                })
                .await? as u64;
            deleted += n;
            if n < super::CLEANUP_BATCH {
                break;
            }
        }
        // Every write is one IMMEDIATE transaction: no enqueue is half done meanwhile.
        self.tx(|tx| {
            tx.execute(
                "DELETE FROM queue_keys WHERE NOT EXISTS \
                 (SELECT 1 FROM tasks t WHERE t.key = queue_keys.key)",
                [],
            )
        })
        .await?;
        Ok(deleted)
    }

    async fn deregister(&self, worker: &str) -> Result<()> {
        let worker = worker.to_owned();
        self.tx(move |tx| {
            tx.execute("DELETE FROM queue_workers WHERE id = ?1", [worker])?;
            Ok(())
        })
        .await
    }

    async fn changed(&self, max: Duration) {
        // The watch is made by the first call (a process that never waits pays nothing), which
        // returns at once: a write before it may have gone unseen.
        let mut fresh = false;
        let wakeups = self
            .wakeups
            .get_or_init(|| async {
                fresh = true;
                wakeups::Wakeups::watch(&self.path)
                    .map_err(|e| {
                        tracing::debug!(error = %e, "no inotify watch on the queue's directory; polling");
                    })
                    .ok()
            })
            .await;
        if fresh {
            return;
        }
        match wakeups {
            Some(wakeups) => {
                let _ = tokio::time::timeout(max, async {
                    tokio::select! {
                        () = wakeups.next() => {}
                        () = self.notify.notified() => {}
                    }
                })
                .await;
            }
            None => {
                let _ = tokio::time::timeout(
                    max.min(Duration::from_millis(50)),
                    self.notify.notified(),
                )
                .await;
            }
        }
    }
}

fn status(c: &Connection) -> rusqlite::Result<Status> {
    let now = now_i64();
    let mut s = Status::default();
    {
        let mut stmt = c.prepare("SELECT state, rank, COUNT(*) FROM tasks GROUP BY state, rank")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        for row in rows {
            let (state, rank, n) = row?;
            s.count(&state, rank, u(n));
        }
    }
    let counts = |sql: &str| -> rusqlite::Result<Vec<KeyCount>> {
        let mut stmt = c.prepare(sql)?;
        let rows = stmt.query_map([], |r| {
            Ok(KeyCount {
                name: r.get(0)?,
                pending: u(r.get(1)?),
                running: u(r.get(2)?),
            })
        })?;
        rows.collect()
    };
    s.groups = counts(
        "SELECT grp, SUM(state = 'pending'), SUM(state = 'running') FROM tasks \
         WHERE state IN ('pending', 'running') AND grp IS NOT NULL GROUP BY grp ORDER BY grp",
    )?;
    s.keys = counts(&format!(
        "SELECT key, SUM(state = 'pending') AS p, SUM(state = 'running') AS r FROM tasks \
         WHERE state IN ('pending', 'running') GROUP BY key ORDER BY r DESC, p DESC, key LIMIT {}",
        Status::KEYS_SHOWN
    ))?;
    s.keys_total = u(c.query_row(
        "SELECT COUNT(DISTINCT key) FROM tasks WHERE state IN ('pending', 'running')",
        [],
        |r| r.get(0),
    )?);
    {
        let mut stmt = c.prepare(
            "SELECT key, id, worker, fence, started_ms, lease_expires_ms FROM tasks \
             WHERE state = 'running' ORDER BY key",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(KeyLease {
                key: r.get(0)?,
                task: u(r.get(1)?),
                holder: r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                fence: r.get::<_, Option<i64>>(3)?.map(u),
                acquired_ms: u(r.get::<_, Option<i64>>(4)?.unwrap_or(0)),
                expires_ms: u(r.get::<_, Option<i64>>(5)?.unwrap_or(0)),
            })
        })?;
        s.leases = rows.collect::<rusqlite::Result<_>>()?;
    }
    {
        let mut stmt = c.prepare(
            "SELECT id, slots, expires_ms FROM queue_workers WHERE expires_ms >= ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([now], |r| {
            Ok(WorkerInfo {
                id: r.get(0)?,
                slots: u32::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                expires_ms: u(r.get(2)?),
            })
        })?;
        s.workers = rows.collect::<rusqlite::Result<_>>()?;
    }
    s.slots = s
        .workers
        .iter()
        .map(|w| u64::from(w.slots))
        .max()
        .unwrap_or(0);
    Ok(s)
}

#[cfg(test)]
mod tests;
mod wakeups;
