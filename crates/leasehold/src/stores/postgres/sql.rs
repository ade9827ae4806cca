//! The SQL text of the PostgreSQL lock store: the table (created on first use), and one
//! statement per step, every time judged by the server's clock (`now()`, the statement's start;
//! a grant's expiry counts from `clock_timestamp()`, the grant itself).
//!
//! A step's parameters are always bind parameters; only the table's and sequence's names (checked
//! identifiers, see [`super::options`]) are written into the text.

/// A table's statements, its names filled in.
#[derive(Debug, Clone)]
pub(super) struct Sql {
    /// `"schema"`.
    pub(super) schema: String,
    /// `"schema"."table"`.
    pub(super) table: String,
    /// The DDL that creates the schema (idempotent; run only when it is missing: `CREATE SCHEMA
    /// IF NOT EXISTS` needs the right to create schemas even when the schema is there).
    pub(super) create_schema: String,
    /// The DDL that creates the table and its fence sequence (idempotent).
    pub(super) create: String,
    /// The DDL that adds the `watched` column to a table created without it (idempotent).
    pub(super) add_watched: String,
    /// Whether the table and its sequence are there, whether the schema is, and whether the
    /// table has its `watched` column: `$1` the table, `$2` the sequence (names as `to_regclass`
    /// reads them), `$3` the schema.
    pub(super) exists: &'static str,
    /// The acquisition of a free (or expired) key, or of one reserved for the caller: the hot
    /// path. Writes nothing otherwise (no waiter registration, no mark), and answers the grant's
    /// fence and times only (the client knows the rest of the record). One fence (a block goes
    /// to [`Sql::acquire`]). `$1` key, `$2` holder, `$3` token, `$4` TTL in ms, `$5` labels,
    /// `$6` pid, `$7` host.
    pub(super) acquire_free: String,
    /// The whole acquisition: a grant as [`Sql::acquire_free`], else a waiter registration or
    /// the mark of a watching caller; the record as it is then, and whether it was granted.
    pub(super) acquire: String,
    pub(super) renew: String,
    pub(super) lost: String,
    pub(super) release: String,
    pub(super) withdraw: String,
    pub(super) inspect: String,
    pub(super) list: String,
    pub(super) force: String,
    /// Marks a held lease `watched`, so that its release notifies (`$1` key, `$2` its fence or
    /// NULL for whichever): whether the key still has that fence (true without one).
    pub(super) mark_watched: String,
    /// `cleanup`'s two statements for the simple-query protocol, one implicit transaction (see
    /// [`Sql::cleanup`]), `{older}` where its age in milliseconds goes.
    cleanup: String,
    /// The sequence's name as a `regclass` literal reads it.
    pub(super) sequence: String,
}

/// A timestamp column as Unix milliseconds (0 for none).
fn ms(col: &str) -> String {
    format!("coalesce(floor(extract(epoch from {col}) * 1000), 0)::bigint")
}

/// The record's columns (of the table named `p`, empty for the only one), in the order
/// [`super::row`] reads them.
fn columns(p: &str) -> String {
    format!(
        "{p}key, {p}holder, {p}token, {p}fence, {}, {}, CASE WHEN {p}token IS NULL THEN 0 ELSE {} END, \
         {p}ttl_ms, {p}waiter, {p}waiter_token, {}, {p}waiter_ttl_ms, {p}pid, {p}host, {p}labels",
        ms(&format!("{p}acquired")),
        ms(&format!("{p}renewed")),
        ms(&format!("{p}expires")),
        ms(&format!("{p}waiter_expires")),
    )
}

/// A held lease: an owner token not yet expired, on the server's clock.
const HELD: &str = "coalesce(t.token IS NOT NULL AND t.expires > now(), false)";
/// A live waiter registration.
const LIVE: &str = "coalesce(t.waiter_token IS NOT NULL AND t.waiter_expires > now(), false)";
/// The live waiter registration is the caller's (`$3`, its token).
const MINE: &str = "coalesce(t.waiter_token = $3, false)";

impl Sql {
    /// The statements of table `table` in schema `schema` (both checked identifiers).
    pub(super) fn new(schema: &str, table: &str) -> Self {
        let quoted_schema = format!("\"{schema}\"");
        let t = format!("\"{schema}\".\"{table}\"");
        let seq_name = format!("{table}_fence");
        let sequence = format!("\"{schema}\".\"{seq_name}\"");
        let cols = columns("");
        let granted = format!("(NOT {HELD} AND NOT ({LIVE} AND NOT {MINE}))");
        let fresh = format!(
            "({MINE} AND {LIVE} AND t.waiter_expires >= now() + ($5::bigint * 2 / 3) * interval '1 millisecond')"
        );
        let registers = format!("($5::bigint > 0 AND ({MINE} OR NOT {LIVE}) AND NOT {fresh})");
        let pick =
            |col: &str| format!("{col} = CASE WHEN {granted} THEN excluded.{col} ELSE t.{col} END");
        let lapsed_waiter = format!(
            "waiter = CASE WHEN {LIVE} THEN t.waiter END, \
             waiter_token = CASE WHEN {LIVE} THEN t.waiter_token END, \
             waiter_expires = CASE WHEN {LIVE} THEN t.waiter_expires END, \
             waiter_ttl_ms = CASE WHEN {LIVE} THEN t.waiter_ttl_ms END"
        );
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {t} (
  key TEXT COLLATE \"C\" PRIMARY KEY,
  holder TEXT,
  token TEXT,
  fence BIGINT NOT NULL,
  acquired TIMESTAMPTZ NOT NULL,
  renewed TIMESTAMPTZ NOT NULL,
  expires TIMESTAMPTZ NOT NULL,
  ttl_ms BIGINT NOT NULL,
  waiter TEXT,
  waiter_token TEXT,
  waiter_expires TIMESTAMPTZ,
  waiter_ttl_ms BIGINT,
  pid INTEGER,
  host TEXT,
  labels TEXT NOT NULL DEFAULT '{{}}',
  watched BOOLEAN NOT NULL DEFAULT false
);
CREATE SEQUENCE IF NOT EXISTS {sequence};"
        );
        // One value of the sequence, or the largest of `$7` values for a block.
        let seq = sequence.replace('\'', "''");
        let block = format!(
            "(CASE WHEN $7::bigint = 1 THEN nextval('{seq}'::regclass) \
             ELSE (SELECT max(nextval('{seq}'::regclass)) FROM generate_series(1, $7::bigint)) END)"
        );
        // The fence and the expiry of a grant are taken on the locked row version, in
        // `DO UPDATE`: `VALUES` is evaluated before the arbiter check and the row lock, and a
        // statement that stalls between the two (a lock wait, a descheduled backend) would be
        // granted a fence below one granted and released meanwhile, and an expiry counted from
        // before its wait. `VALUES` still takes one for a key with no row: `cleanup` locks the
        // table against inserts in flight (see `cleanup` below), so no row deleted meanwhile can
        // be recreated with it. `clock_timestamp()` is the server's time at the grant; the
        // client counts its lease from its send, earlier still.
        let expires = "clock_timestamp() + $4::bigint * interval '1 millisecond'";
        // The hot path: what `acquire` does when it grants, and nothing else. `watched` stays as
        // it was (a contender that marked a free row reserved for us still waits for our
        // release). One fence only: a block's subquery costs its setup at every run, used or
        // not. Its parameters are numbered apart from `acquire`'s.
        let one = format!("nextval('{seq}'::regclass)");
        let acquire_free = format!(
            "INSERT INTO {t} AS t (key, holder, token, fence, acquired, renewed, expires, ttl_ms, pid, host, labels)
VALUES ($1, $2, $3, {one}, now(), now(), {expires}, $4::bigint, $6::integer, $7, $5)
ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, token = excluded.token,
  fence = {one}, acquired = now(), renewed = now(), expires = {expires},
  ttl_ms = excluded.ttl_ms, pid = excluded.pid, host = excluded.host, labels = excluded.labels,
  waiter = NULL, waiter_token = NULL, waiter_expires = NULL, waiter_ttl_ms = NULL
WHERE {granted}
RETURNING fence, acquired, expires"
        );
        // A held key: the caller registers as its waiter (`$5` > 0, see `registers`), or else,
        // watching (`$10`), marks the row so that its release notifies.
        let marks = format!("($10::boolean AND NOT {registers} AND NOT t.watched)");
        let unless_registers = |col: &str, value: &str| {
            format!("{col} = CASE WHEN {granted} THEN NULL WHEN {registers} THEN {value} ELSE t.{col} END")
        };
        let acquire = format!(
            "INSERT INTO {t} AS t (key, holder, token, fence, acquired, renewed, expires, ttl_ms, pid, host, labels)
VALUES ($1, $2, $3, {block}, now(), now(), {expires}, $4::bigint, $8::integer, $9, $6)
ON CONFLICT (key) DO UPDATE SET
  {}, {}, fence = CASE WHEN {granted} THEN {block} ELSE t.fence END, {},
  {}, expires = CASE WHEN {granted} THEN {expires} ELSE t.expires END, {}, {}, {}, {},
  {}, {}, {}, {},
  watched = t.watched OR ($10::boolean AND NOT {granted})
WHERE {granted} OR {registers} OR {marks}
RETURNING {cols}, (token = $3 AND acquired = now())",
            pick("holder"),
            pick("token"),
            pick("acquired"),
            pick("renewed"),
            pick("ttl_ms"),
            pick("pid"),
            pick("host"),
            pick("labels"),
            unless_registers("waiter", "$2"),
            unless_registers("waiter_token", "$3"),
            unless_registers(
                "waiter_expires",
                "now() + $5::bigint * interval '1 millisecond'"
            ),
            unless_registers("waiter_ttl_ms", "$5::bigint"),
        );
        // Many leases in one statement: `$1` keys, `$2` tokens, `$3` TTLs in milliseconds.
        let renew = format!(
            "UPDATE {t} AS t SET renewed = now(), ttl_ms = r.ttl,
  expires = now() + r.ttl * interval '1 millisecond', {lapsed_waiter}
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, ttl)
WHERE t.key = r.key AND t.token = r.token AND t.expires > now()
RETURNING {}",
            columns("t.")
        );
        let lost = format!("SELECT key, holder, token FROM {t} WHERE key = ANY($1::text[])");
        // `$3` the channel, `$4` the payload (the key). It notifies only when someone waits: a
        // live registered waiter, or a watching contender whose attempt marked the row (the
        // notification queue serialises the commits of every transaction that notifies). The
        // old row decides, so the call sits in the `SET` of the mark it clears (`RETURNING`
        // sees the new row only); a `SET` evaluated again on a newer row version (a concurrent
        // write, re-checked) can notify once more for nothing, never miss one. `pg_notify`'s
        // text is '', not NULL: the mark is false either way. A lapsed waiter registration is
        // left as it is (every reader judges it by its expiry; the next grant clears it).
        let release = format!(
            "UPDATE {t} AS t SET holder = NULL, token = NULL, renewed = now(),
  watched = CASE WHEN t.watched OR {LIVE} THEN pg_notify($3, $4)::text IS NULL ELSE false END
WHERE t.key = $1 AND t.token = $2 RETURNING t.expires > now()"
        );
        let withdraw = format!(
            "WITH r AS (UPDATE {t} SET waiter = NULL, waiter_token = NULL, waiter_expires = NULL,
  waiter_ttl_ms = NULL WHERE key = $1 AND waiter_token = $2 RETURNING 1)
SELECT pg_notify($3, $4)::text FROM r"
        );
        let inspect = format!("SELECT {cols} FROM {t} WHERE key = $1");
        let list =
            format!("SELECT {cols} FROM {t} WHERE starts_with(key, $1) ORDER BY key COLLATE \"C\"");
        // The record as it was, then freed (`$2` the channel, `$3` the payload).
        let force = format!(
            "WITH old AS (SELECT {cols} FROM {t} WHERE key = $1 AND token IS NOT NULL FOR UPDATE),
  up AS (UPDATE {t} AS t SET holder = NULL, token = NULL, renewed = now(), watched = false,
         {lapsed_waiter}
         FROM old WHERE t.key = old.key RETURNING 1)
SELECT old.*, pg_notify($2, $3)::text FROM old"
        );
        let mark_watched = format!(
            "WITH m AS (UPDATE {t} AS t SET watched = true WHERE t.key = $1 AND {HELD}
  AND NOT t.watched AND ($2::bigint IS NULL OR t.fence = $2) RETURNING 1)
SELECT $2::bigint IS NULL OR EXISTS (SELECT 1 FROM {t} AS t WHERE t.key = $1 AND t.fence = $2)"
        );
        // Free (or expired), no live waiter, untouched for `{older}` milliseconds. Fences come
        // from the sequence, which no deletion lowers. The table lock first waits for every
        // acquire in flight (an `INSERT` holds ROW EXCLUSIVE from its start, before its `VALUES`
        // take a fence) and holds off new ones until the commit: an insert that took its fence
        // before the deletion cannot recreate the key with it.
        let cleanup = format!(
            "LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE;
WITH d AS (DELETE FROM {t} AS t WHERE NOT {HELD} AND NOT {LIVE}
  AND greatest(t.renewed, t.acquired, CASE WHEN t.token IS NOT NULL THEN t.expires END)
      + {{older}}::bigint * interval '1 millisecond' <= now()
  RETURNING 1)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM {t})"
        );
        let add_watched = format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS watched BOOLEAN NOT NULL DEFAULT false;"
        );
        Sql {
            add_watched,
            schema: quoted_schema,
            table: t,
            create,
            exists:
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL, \
                     to_regnamespace($3) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute \
                     WHERE attrelid = to_regclass($1) AND attname = 'watched' AND NOT attisdropped)",
            acquire_free,
            create_schema: format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\";"),
            acquire,
            renew,
            lost,
            release,
            withdraw,
            inspect,
            list,
            force,
            mark_watched,
            cleanup,
            sequence,
        }
    }
}

impl Sql {
    /// `cleanup`'s text for rows untouched for `older_ms` milliseconds: a table lock and the
    /// delete, sent together by the simple-query protocol, so they run as one implicit
    /// transaction that no other statement on the shared connection joins.
    pub(super) fn cleanup(&self, older_ms: i64) -> String {
        self.cleanup.replace("{older}", &older_ms.to_string())
    }
}
