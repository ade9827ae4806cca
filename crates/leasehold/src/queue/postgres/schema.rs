//! The SQL text of the PostgreSQL queue that is not one call's own: the schema (created at
//! connect, idempotently), the server's clock, and the dispatch choice.

/// The server's clock in Unix milliseconds.
pub(super) const NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
  id BIGSERIAL PRIMARY KEY,
  key TEXT NOT NULL,
  grp TEXT,
  priority TEXT NOT NULL,
  rank BIGINT NOT NULL,
  payload TEXT NOT NULL,
  state TEXT NOT NULL,
  policy TEXT NOT NULL,
  max_attempts BIGINT NOT NULL,
  attempts BIGINT NOT NULL DEFAULT 0,
  timeout_ms BIGINT,
  enqueued_ms BIGINT NOT NULL,
  aged_ms BIGINT NOT NULL,
  started_ms BIGINT,
  ended_ms BIGINT,
  worker TEXT,
  fence BIGINT,
  lease_expires_ms BIGINT,
  cancel BIGINT NOT NULL DEFAULT 0,
  detail TEXT
);
CREATE INDEX IF NOT EXISTS tasks_by_key ON tasks (key, state, rank, id);
CREATE INDEX IF NOT EXISTS tasks_by_state ON tasks (state, grp);
CREATE TABLE IF NOT EXISTS queue_keys (key TEXT PRIMARY KEY, served BIGINT NOT NULL DEFAULT 0, running BIGINT);
CREATE TABLE IF NOT EXISTS queue_groups (grp TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS queue_slots (n BIGINT PRIMARY KEY, task BIGINT);
CREATE TABLE IF NOT EXISTS queue_workers (id TEXT PRIMARY KEY, slots BIGINT NOT NULL, expires_ms BIGINT NOT NULL);
CREATE SEQUENCE IF NOT EXISTS queue_served;
";

/// The dispatch choice (see the SQLite backend): the head of every key with nothing running, best
/// effective priority, then the key served least recently, then arrival; locked key rows are
/// skipped.
pub(super) const PICK: &str = "
SELECT t.id, k.key FROM queue_keys k
CROSS JOIN LATERAL (SELECT h.id, h.rank, h.grp FROM tasks h
                    WHERE h.key = k.key AND h.state = 'pending' ORDER BY h.rank, h.id LIMIT 1) t
WHERE k.running IS NULL
  AND ($1::bigint IS NULL OR t.grp IS NULL
       OR (SELECT COUNT(*) FROM tasks g WHERE g.state = 'running' AND g.grp = t.grp) < $1::bigint)
ORDER BY t.rank, k.served, t.id LIMIT 1
FOR UPDATE OF k SKIP LOCKED";
