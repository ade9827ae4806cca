//! The statements as `Sql::new` wrote them with `format!`, kept to compare the files with.
#![allow(dead_code)]

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
    /// The DDL that brings a table made by an earlier version up to date (idempotent): the
    /// `watched` column, the permit columns and the permit table.
    pub(super) upgrade: String,
    /// Whether the table and its sequence are there, whether the schema is, whether the table has
    /// its `watched` column, and whether it has its permit columns and permit table: `$1` the
    /// table, `$2` the sequence, `$4` the permit table (names as `to_regclass` reads them), `$3`
    /// the schema.
    pub(super) exists: &'static str,
    /// `"schema"."table_permits"`: the permits held on semaphore and read-write keys, a row each.
    pub(super) permits: String,
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
    /// Marks a held lease (or a key with live permits) `watched`, so that its release notifies
    /// (`$1` key, `$2` its fence or NULL for whichever): whether the key still has that fence
    /// (true without one).
    pub(super) mark_watched: String,
    /// A permit acquisition, judged and written in one statement (see [`Sql::new`]): `$1` key,
    /// `$2` holder, `$3` token, `$4` TTL in ms, `$5` waiter TTL in ms (0: none), `$6` labels,
    /// `$7` pid, `$8` host, `$9` watching, `$10` the kind (`semaphore`, `read-write`), `$11` the
    /// semaphore's count (NULL for a read-write lock), `$12` whether it is a write. One row: the
    /// outcome (`refused`, `raced`, `granted`, `held`), whether a lock holds the key,
    /// then the record ([`full`]).
    pub(super) permit_acquire: String,
    /// Makes a permit key with no live holder and no live waiter a lock key again (`$1` key): a
    /// row (whether the key is busy, its kind, its count, whether it was made a lock) when the
    /// key is a permit key.
    pub(super) to_lock: String,
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
/// [`super::record`] reads them.
fn columns(p: &str) -> String {
    waiter_columns(p, false)
}

/// [`columns`], the waiter registration left out unless it is live when `live_only`.
fn waiter_columns(p: &str, live_only: bool) -> String {
    let live =
        format!("coalesce({p}waiter_token IS NOT NULL AND {p}waiter_expires > now(), false)");
    let waiter = |col: String, none: &str| match live_only {
        true => format!("CASE WHEN {live} THEN {col} ELSE {none} END"),
        false => col,
    };
    format!(
        "{p}key, {p}holder, {p}token, {p}fence, {}, {}, CASE WHEN {p}token IS NULL THEN 0 ELSE {} END, \
         {p}ttl_ms, {}, {}, {}, {}, {p}pid, {p}host, {p}labels",
        ms(&format!("{p}acquired")),
        ms(&format!("{p}renewed")),
        ms(&format!("{p}expires")),
        waiter(format!("{p}waiter"), "NULL"),
        waiter(format!("{p}waiter_token"), "NULL"),
        waiter(ms(&format!("{p}waiter_expires")), "0"),
        waiter(format!("{p}waiter_ttl_ms"), "NULL"),
    )
}

/// The permit columns of the key table row `p` (a prefix, as for [`columns`]) and `holders`
/// (an expression: the holders as a JSON array, NULL for none), after [`columns`]: the record as
/// `Inner::full_record` reads it. The waiter's write flag shows only while its
/// registration is live.
fn permit_columns(p: &str, holders: &str) -> String {
    format!(
        "{p}permit_kind, {p}permit_count, \
         coalesce({p}waiter_write AND {p}waiter_expires > now(), false), {holders}"
    )
}

/// [`columns`] and [`permit_columns`]: a whole record, its holders `holders`.
pub(super) fn full(p: &str, holders: &str) -> String {
    format!("{}, {}", columns(p), permit_columns(p, holders))
}

/// [`full`] with a lapsed waiter registration left out: what a holder or a contender is handed.
fn seen(p: &str, holders: &str) -> String {
    format!(
        "{}, {}",
        waiter_columns(p, true),
        permit_columns(p, holders)
    )
}

/// The holders in the permit rows `from` (a `FROM` item aliased `x`) as a JSON array in grant
/// order, NULL for none; [`super::permits`] reads it.
fn holders(from: &str) -> String {
    format!(
        "(SELECT json_agg(json_build_object('holder', x.holder, 'token', x.token, \
         'fence', x.fence, 'write', x.write, 'acquired', {}, 'renewed', {}, 'expires', {}, \
         'ttl_ms', x.ttl_ms, 'pid', x.pid, 'host', x.host, 'labels', x.labels) \
         ORDER BY x.fence)::text FROM {from})",
        ms("x.acquired"),
        ms("x.renewed"),
        ms("x.expires"),
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
        let pt = format!("\"{schema}\".\"{table}_permits\"");
        let cols = columns("");
        let granted = format!("(NOT {HELD} AND NOT ({LIVE} AND NOT {MINE}))");
        // The whole acquisition also grants a key it holds already: an earlier attempt of the
        // same acquisition (its token) was granted and its answer lost. It is granted again, in
        // this write, with a new fence and its lease counted from now, as the holder's
        // `valid_until` counts from this attempt's send (never from the lost grant's, after
        // which the server would free it first). A live registered waiter stays.
        let regrant = format!("({HELD} AND coalesce(t.token = $3, false))");
        let granted_any = format!("({regrant} OR {granted})");
        let fresh = format!(
            "({MINE} AND {LIVE} AND t.waiter_expires >= now() + ($5::bigint * 2 / 3) * interval '1 millisecond')"
        );
        let registers = format!("($5::bigint > 0 AND ({MINE} OR NOT {LIVE}) AND NOT {fresh})");
        let pick = |col: &str| {
            format!("{col} = CASE WHEN {granted_any} THEN excluded.{col} ELSE t.{col} END")
        };
        // The waiter's write flag goes with a lapsed registration.
        let lapsed_write =
            format!("waiter_write = CASE WHEN {LIVE} THEN t.waiter_write ELSE false END");
        let lapsed_waiter = format!(
            "waiter = CASE WHEN {LIVE} THEN t.waiter END, \
             waiter_token = CASE WHEN {LIVE} THEN t.waiter_token END, \
             waiter_expires = CASE WHEN {LIVE} THEN t.waiter_expires END, \
             waiter_ttl_ms = CASE WHEN {LIVE} THEN t.waiter_ttl_ms END"
        );
        // The permits of semaphore and read-write keys, a row each. The key's row in the lease
        // table keeps what the key is (`permit_kind`, `permit_count`), its fence, its registered
        // waiter (`waiter_write`: a writer) and its `watched` mark; no lock holder.
        let create_permits = format!(
            "CREATE TABLE IF NOT EXISTS {pt} (
  key TEXT COLLATE \"C\" NOT NULL,
  token TEXT NOT NULL,
  holder TEXT NOT NULL,
  fence BIGINT NOT NULL,
  write BOOLEAN NOT NULL DEFAULT false,
  acquired TIMESTAMPTZ NOT NULL,
  renewed TIMESTAMPTZ NOT NULL,
  expires TIMESTAMPTZ NOT NULL,
  ttl_ms BIGINT NOT NULL,
  pid INTEGER,
  host TEXT,
  labels TEXT NOT NULL DEFAULT '{{}}',
  PRIMARY KEY (key, token)
);"
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
  watched BOOLEAN NOT NULL DEFAULT false,
  permit_kind TEXT,
  permit_count INTEGER,
  waiter_write BOOLEAN NOT NULL DEFAULT false
);
CREATE SEQUENCE IF NOT EXISTS {sequence};
{create_permits}"
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
WHERE {granted} AND t.permit_kind IS NULL
RETURNING fence, acquired, expires"
        );
        // A held key: the caller registers as its waiter (`$5` > 0, see `registers`), or else,
        // watching (`$10`), marks the row so that its release notifies.
        let marks = format!("($10::boolean AND NOT {registers} AND NOT t.watched)");
        let unless_registers = |col: &str, value: &str| {
            format!(
                "{col} = CASE WHEN {granted_any} AND ({MINE} OR NOT {LIVE}) THEN NULL \
                 WHEN {registers} THEN {value} ELSE t.{col} END"
            )
        };
        let acquire = format!(
            "INSERT INTO {t} AS t (key, holder, token, fence, acquired, renewed, expires, ttl_ms, pid, host, labels)
VALUES ($1, $2, $3, {block}, now(), now(), {expires}, $4::bigint, $8::integer, $9, $6)
ON CONFLICT (key) DO UPDATE SET
  {}, {}, fence = CASE WHEN {granted_any} THEN {block} ELSE t.fence END, {},
  {}, expires = CASE WHEN {granted_any} THEN {expires} ELSE t.expires END, {}, {}, {}, {},
  {}, {}, {}, {},
  watched = t.watched OR ($10::boolean AND NOT {granted_any})
WHERE ({granted_any} OR {registers} OR {marks}) AND t.permit_kind IS NULL
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
        // Many leases in one statement: `$1` keys, `$2` tokens, `$3` TTLs in milliseconds; each
        // row answered carries its token last. A lock's row is renewed where its token is. A
        // permit is renewed in its own row, and its key's row is written too (a new row version:
        // a permit acquisition that judged the key on an older snapshot sees it changed, see
        // `permit_acquire`), locked first and in key order, so that two batches renewing
        // permits of the same keys never wait for each other in a cycle. Its row answered is
        // the key's, with the holders (the others as this statement's snapshot has them).
        let permit_holders_renewed = holders(&format!(
            "(SELECT y.* FROM {pt} AS y WHERE y.key = kb.key AND y.expires > now() \
             AND NOT EXISTS (SELECT 1 FROM pu AS z WHERE z.key = y.key AND z.token = y.token) \
             UNION ALL SELECT z.* FROM pu AS z WHERE z.key = kb.key) AS x"
        ));
        let renew = format!(
            "WITH r AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, ttl)),
lk AS (UPDATE {t} AS t SET renewed = now(), ttl_ms = r.ttl,
  expires = now() + r.ttl * interval '1 millisecond', {lapsed_waiter}
  FROM r
  WHERE t.key = r.key AND t.token = r.token AND t.expires > now()
  RETURNING {}, t.token),
pk AS (SELECT t.key FROM {t} AS t WHERE t.permit_kind IS NOT NULL AND t.key IN
  (SELECT r.key FROM r JOIN {pt} AS p ON p.key = r.key AND p.token = r.token AND p.expires > now())
  ORDER BY t.key FOR UPDATE OF t),
kb AS (UPDATE {t} AS t SET {lapsed_waiter}, {lapsed_write} FROM pk WHERE t.key = pk.key RETURNING t.*),
pu AS (UPDATE {pt} AS p SET renewed = now(), ttl_ms = r.ttl,
  expires = now() + r.ttl * interval '1 millisecond'
  FROM r, kb
  WHERE p.key = r.key AND p.token = r.token AND kb.key = r.key AND p.expires > now()
  RETURNING p.*)
SELECT * FROM lk
UNION ALL
SELECT {}, pu.token FROM pu JOIN kb ON kb.key = pu.key",
            full("t.", "NULL::text"),
            full("kb.", &permit_holders_renewed),
        );
        // What became of leases not renewed: `$1` keys, `$2` tokens; per key and token, who holds
        // the key, and whether a permit row of the token is still there (it expired).
        let lost = format!(
            "SELECT r.key, r.token, t.holder, t.token, EXISTS (SELECT 1 FROM {pt} AS p \
             WHERE p.key = r.key AND p.token = r.token) \
             FROM unnest($1::text[], $2::text[]) AS r(key, token) LEFT JOIN {t} AS t ON t.key = r.key"
        );
        // `$3` the channel, `$4` the payload (the key). It notifies only when someone waits: a
        // live registered waiter, or a watching contender whose attempt marked the row (the
        // notification queue serialises the commits of every transaction that notifies). The
        // old row decides, so the call sits in the `SET` of the mark it clears (`RETURNING`
        // sees the new row only); a `SET` evaluated again on a newer row version (a concurrent
        // write, re-checked) can notify once more for nothing, never miss one. `pg_notify`'s
        // text is '', not NULL: the mark is false either way. A lapsed waiter registration is
        // left as it is (every reader judges it by its expiry; the next grant clears it).
        //
        // A permit's token (its key's row has a permit kind and a permit row of the token)
        // writes the key's row the same way, which notifies the same way, and then releases its
        // permit row and the permit rows that expired; the lock's fields stay as they are. One
        // `UPDATE` of the key's row serves both, so that a lock's release costs little more
        // than it did before there were permits. A row per release that was still live or not.
        let notify = format!(
            "watched = CASE WHEN t.watched OR {LIVE} THEN pg_notify($3, $4)::text IS NULL ELSE false END"
        );
        let release = format!(
            "WITH u AS (UPDATE {t} AS t SET holder = CASE WHEN t.token = $2 THEN NULL ELSE t.holder END,
  token = CASE WHEN t.token = $2 THEN NULL ELSE t.token END, renewed = now(), {notify}
  WHERE t.key = $1 AND (t.token = $2 OR (t.permit_kind IS NOT NULL
    AND EXISTS (SELECT 1 FROM {pt} AS p WHERE p.key = $1 AND p.token = $2)))
  RETURNING t.permit_kind IS NULL AS lock, t.expires > now() AS live),
pd AS (DELETE FROM {pt} AS p USING u WHERE NOT u.lock AND p.key = $1
  AND (p.token = $2 OR p.expires <= now())
  RETURNING p.token = $2 AND p.expires > now() AS live)
SELECT live FROM u WHERE u.lock UNION ALL SELECT live FROM pd"
        );
        let withdraw = format!(
            "WITH r AS (UPDATE {t} SET waiter = NULL, waiter_token = NULL, waiter_expires = NULL,
  waiter_ttl_ms = NULL, waiter_write = false WHERE key = $1 AND waiter_token = $2 RETURNING 1)
SELECT pg_notify($3, $4)::text FROM r"
        );
        // The whole record: a permit key's holders (every permit row, lapsed ones too: readers
        // judge them by their expiry, as they judge a lock's).
        let all_holders = format!(
            "CASE WHEN t.permit_kind IS NOT NULL THEN {} END",
            holders(&format!("{pt} AS x WHERE x.key = t.key"))
        );
        let record = full("t.", &all_holders);
        let inspect = format!("SELECT {record} FROM {t} AS t WHERE t.key = $1");
        let list = format!(
            "SELECT {record} FROM {t} AS t WHERE starts_with(t.key, $1) ORDER BY t.key COLLATE \"C\""
        );
        // An operator frees what `$4` holds (a holder id or an owner token; NULL: whoever holds):
        // a lock's holder, as before; a permit key's matching permits (and those that expired),
        // judged on this statement's snapshot and written only if the key's row is still the
        // version read (else the row answered says `false`: the caller runs it again). One row
        // when something was freed: whether it was written, the record as it was, and the
        // notification (`$2` the channel, `$3` the payload).
        let force = format!(
            "WITH old AS (SELECT {} FROM {t} AS t
  WHERE t.key = $1 AND t.token IS NOT NULL AND ($4::text IS NULL OR t.holder = $4 OR t.token = $4)
  FOR UPDATE),
up AS (UPDATE {t} AS t SET holder = NULL, token = NULL, renewed = now(), watched = false,
  {lapsed_waiter}
  FROM old WHERE t.key = old.key RETURNING 1),
pc AS (SELECT t.*, t.xmin AS v FROM {t} AS t
  WHERE t.key = $1 AND t.permit_kind IS NOT NULL AND t.token IS NULL),
po AS (SELECT p.* FROM {pt} AS p WHERE p.key = $1 AND EXISTS (SELECT 1 FROM pc)),
pm AS (SELECT po.token FROM po WHERE $4::text IS NULL OR po.holder = $4 OR po.token = $4),
pk AS (UPDATE {t} AS t SET renewed = now(), watched = false, {lapsed_waiter}, {lapsed_write}
  FROM pc WHERE t.key = pc.key AND t.xmin = pc.v AND EXISTS (SELECT 1 FROM pm) RETURNING t.key),
pd AS (DELETE FROM {pt} AS p USING pk
  WHERE p.key = pk.key AND (p.token IN (SELECT pm.token FROM pm) OR p.expires <= now()) RETURNING 1)
SELECT true, old.*, pg_notify($2, $3)::text FROM old
UNION ALL
SELECT EXISTS (SELECT 1 FROM pk), {},
  CASE WHEN EXISTS (SELECT 1 FROM pk) THEN pg_notify($2, $3)::text END
FROM pc WHERE EXISTS (SELECT 1 FROM pm)",
            full("t.", "NULL::text"),
            full("pc.", &holders("po AS x")),
        );
        let mark_watched = format!(
            "WITH m AS (UPDATE {t} AS t SET watched = true WHERE t.key = $1
  AND ({HELD} OR (t.permit_kind IS NOT NULL
    AND EXISTS (SELECT 1 FROM {pt} AS p WHERE p.key = t.key AND p.expires > now())))
  AND NOT t.watched AND ($2::bigint IS NULL OR t.fence = $2) RETURNING 1)
SELECT $2::bigint IS NULL OR EXISTS (SELECT 1 FROM {t} AS t WHERE t.key = $1 AND t.fence = $2)"
        );
        // Free (or expired), no live waiter, no live permit, untouched (its permits included)
        // for `{older}` milliseconds; its permit rows go with it. Fences come from the sequence,
        // which no deletion lowers. The table lock first waits for every acquire in flight (an
        // `INSERT` holds ROW EXCLUSIVE from its start, before its `VALUES` take a fence) and
        // holds off new ones until the commit: an insert that took its fence before the deletion
        // cannot recreate the key with it. Every statement that writes a permit row writes its
        // key's row too, so the lock holds those off as well.
        let cleanup = format!(
            "LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE;
WITH d AS (DELETE FROM {t} AS t WHERE NOT {HELD} AND NOT {LIVE}
  AND NOT EXISTS (SELECT 1 FROM {pt} AS p WHERE p.key = t.key AND p.expires > now())
  AND greatest(t.renewed, t.acquired, CASE WHEN t.token IS NOT NULL THEN t.expires END,
      (SELECT max(greatest(p.renewed, p.expires)) FROM {pt} AS p WHERE p.key = t.key))
      + {{older}}::bigint * interval '1 millisecond' <= now()
  RETURNING t.key),
dp AS (DELETE FROM {pt} AS p USING d WHERE p.key = d.key)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM {t})"
        );
        let upgrade = format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS watched BOOLEAN NOT NULL DEFAULT false,
  ADD COLUMN IF NOT EXISTS permit_kind TEXT, ADD COLUMN IF NOT EXISTS permit_count INTEGER,
  ADD COLUMN IF NOT EXISTS waiter_write BOOLEAN NOT NULL DEFAULT false;
{create_permits}"
        );
        let permit_acquire = permit_acquire(&t, &pt, &seq);
        let to_lock = format!(
            "WITH c AS (SELECT t.xmin AS v, t.permit_kind, t.permit_count,
    coalesce(t.waiter_token IS NOT NULL AND t.waiter_expires > now(), false)
    OR EXISTS (SELECT 1 FROM {pt} AS p WHERE p.key = t.key AND p.expires > now()) AS busy
  FROM {t} AS t WHERE t.key = $1 AND t.permit_kind IS NOT NULL),
up AS (UPDATE {t} AS t SET permit_kind = NULL, permit_count = NULL, waiter_write = false
  FROM c WHERE t.key = $1 AND t.xmin = c.v AND NOT c.busy RETURNING t.key),
del AS (DELETE FROM {pt} AS p USING up WHERE p.key = up.key)
SELECT c.busy, c.permit_kind, c.permit_count, EXISTS (SELECT 1 FROM up) FROM c"
        );
        Sql {
            upgrade,
            schema: quoted_schema,
            table: t,
            permits: pt,
            create,
            exists:
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL, \
                     to_regnamespace($3) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute \
                     WHERE attrelid = to_regclass($1) AND attname = 'watched' AND NOT attisdropped), \
                     to_regclass($4) IS NOT NULL AND (SELECT count(*) FROM pg_attribute \
                     WHERE attrelid = to_regclass($1) AND NOT attisdropped \
                     AND attname IN ('permit_kind', 'permit_count', 'waiter_write')) = 3",
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
            permit_acquire,
            to_lock,
            cleanup,
            sequence,
        }
    }
}

/// The permit acquisition (see [`Sql::permit_acquire`] for its parameters and answer) on the
/// lease table `t`, the permit table `pt` and the fence sequence `seq` (quoted for a literal).
///
/// A permit's decision reads the key's row and its permit rows, and a statement sees other
/// rows than the one it writes as its snapshot had them (read committed): a permit granted,
/// released or renewed by a transaction that commits after the snapshot is not in it. So the
/// decision is taken on the snapshot (`c`, `live`), and written only if the key's row is still
/// the version the snapshot read (`xmin`): every statement that changes a permit row (grant,
/// release, renewal, force-release) writes its key's row too, after locking it and before
/// touching any permit row, so a key's row of the same version means the same permits. A write
/// that finds a newer version writes nothing and answers `raced`: the caller runs the statement
/// again, on a fresh snapshot. A decision that writes nothing (held, refused) is the snapshot's
/// answer as it is. A request whose token holds a live permit already (an earlier attempt was
/// granted and its answer lost) is granted again: its permit row written anew, with a new fence
/// and its expiry counted from now.
///
/// The rules are `decide::permits`'s with PostgreSQL's one registered waiter for the line: a
/// semaphore of `n` grants while the live holders, the registered waiter (if live and
/// another's) and the caller are at most `n`; a writer only with no live holder and no other
/// live registered waiter; a reader with no live writer holding, no writer registered as
/// waiter, and fewer than `PERMIT_LIMIT` holders and waiter together. A request of another kind or count than the
/// key's while it has a live holder or waiter (or a live lock holder) is `refused`; a key with
/// neither takes the kind asked, keeping its fence. A grant's fence is the sequence's next
/// value, taken on the locked row (as a lock grant's), and the key's row keeps the last one.
fn permit_acquire(t: &str, pt: &str, seq: &str) -> String {
    let limit = crate::record::PERMIT_LIMIT;
    let expires = "clock_timestamp() + $4::bigint * interval '1 millisecond'";
    let waiter_expires = "now() + $5::bigint * interval '1 millisecond'";
    // A registration, or the caller's own, is cleared when the caller is granted or when it
    // lapsed; kept otherwise.
    let waiter = |col: &str, value: &str, none: &str| {
        format!(
            "{col} = CASE WHEN e.registers THEN {value} \
             WHEN (e.grant AND e.waiter_mine) OR NOT e.waiter_live THEN {none} ELSE t.{col} END"
        )
    };
    // A key that takes a kind is no lock any more: its lock holder's part goes.
    let adopt =
        |col: &str, none: &str| format!("{col} = CASE WHEN e.adopt THEN {none} ELSE t.{col} END");
    let live_holders = holders("live AS x");
    // A grant of a permit the caller holds already (its answer was lost) writes its row anew.
    let written_holders =
        holders("(SELECT * FROM live WHERE live.token <> $3 UNION ALL SELECT * FROM ins) AS x");
    format!(
        "WITH c AS (SELECT t.*, t.xmin AS v FROM {t} AS t WHERE t.key = $1),
live AS (SELECT p.* FROM {pt} AS p WHERE p.key = $1 AND p.expires > now()),
s AS (SELECT c.v, c.permit_kind AS kind, c.permit_count AS count, c.waiter_expires,
    coalesce(c.token IS NOT NULL AND c.expires > now(), false) AS lock_held,
    coalesce(c.waiter_token IS NOT NULL AND c.waiter_expires > now(), false) AS waiter_live,
    coalesce(c.waiter_token = $3, false) AS waiter_mine,
    coalesce(c.waiter_write, false) AS waiter_write,
    coalesce(c.watched, false) AS watched,
    (SELECT count(*) FROM live) AS held,
    EXISTS (SELECT 1 FROM live WHERE live.write) AS writer_holds,
    EXISTS (SELECT 1 FROM live WHERE live.token = $3) AS mine
  FROM (VALUES (1)) AS one (x) LEFT JOIN c ON true),
d AS (SELECT s.*,
    coalesce(s.kind = $10::text AND s.count IS NOT DISTINCT FROM $11::integer, false) AS same,
    CASE WHEN s.waiter_live AND NOT s.waiter_mine THEN 1 ELSE 0 END AS ahead
  FROM s),
f AS (SELECT d.*,
    d.lock_held OR (NOT d.same AND (d.waiter_live OR d.held > 0)) AS refused
  FROM d),
g AS (SELECT f.*, NOT f.refused AND NOT f.same AS adopt,
    NOT f.refused AND (f.mine OR CASE
      WHEN $10::text = 'semaphore' THEN f.held + f.ahead + 1 <= $11::integer
      WHEN $12::boolean THEN f.held = 0 AND f.ahead = 0
      ELSE NOT f.writer_holds AND NOT (f.ahead = 1 AND f.waiter_write) AND f.held + f.ahead < {limit}
    END) AS grant
  FROM f),
h AS (SELECT g.*,
    $5::bigint > 0 AND NOT g.refused AND NOT g.mine AND NOT g.grant
      AND (g.waiter_mine OR NOT g.waiter_live)
      AND NOT (g.waiter_mine AND g.waiter_live
        AND g.waiter_expires >= now() + ($5::bigint * 2 / 3) * interval '1 millisecond')
      AS registers
  FROM g),
e AS (SELECT h.*,
    $9::boolean AND NOT h.refused AND NOT h.mine AND NOT h.grant AND NOT h.registers
      AND NOT h.watched AS marks
  FROM h),
ku AS (UPDATE {t} AS t SET
    {}, {}, {}, {}, {},
    permit_kind = $10::text, permit_count = $11::integer,
    fence = CASE WHEN e.grant THEN nextval('{seq}'::regclass) ELSE t.fence END,
    {}, {}, {}, {}, {},
    watched = t.watched OR e.marks
  FROM e WHERE t.key = $1 AND t.xmin = e.v AND (e.grant OR e.registers OR e.marks)
  RETURNING t.*),
ki AS (INSERT INTO {t} AS t (key, fence, acquired, renewed, expires, ttl_ms, waiter, waiter_token,
    waiter_expires, waiter_ttl_ms, waiter_write, permit_kind, permit_count)
  SELECT $1, nextval('{seq}'::regclass), now(), now(), now(), 0,
    CASE WHEN e.registers THEN $2 END, CASE WHEN e.registers THEN $3 END,
    CASE WHEN e.registers THEN {waiter_expires} END, CASE WHEN e.registers THEN $5::bigint END,
    e.registers AND $12::boolean, $10::text, $11::integer
  FROM e WHERE e.v IS NULL AND (e.grant OR e.registers OR e.marks)
  ON CONFLICT (key) DO NOTHING
  RETURNING t.*),
k AS (SELECT * FROM ku UNION ALL SELECT * FROM ki),
ins AS (INSERT INTO {pt} AS p (key, token, holder, fence, write, acquired, renewed, expires,
    ttl_ms, pid, host, labels)
  SELECT k.key, $3, $2, k.fence, $12::boolean, now(), now(), {expires}, $4::bigint, $7::integer,
    $8, $6
  FROM k, e WHERE e.grant
  ON CONFLICT (key, token) DO UPDATE SET holder = excluded.holder, fence = excluded.fence,
    write = excluded.write, acquired = excluded.acquired, renewed = excluded.renewed,
    expires = excluded.expires, ttl_ms = excluded.ttl_ms, pid = excluded.pid,
    host = excluded.host, labels = excluded.labels
  RETURNING p.*),
gone AS (DELETE FROM {pt} AS p USING k WHERE p.key = k.key AND p.expires <= now() AND p.token <> $3)
SELECT CASE WHEN e.refused THEN 'refused'
    WHEN (e.grant OR e.registers OR e.marks) AND NOT EXISTS (SELECT 1 FROM k) THEN 'raced'
    WHEN e.grant THEN 'granted' ELSE 'held' END,
  e.lock_held, r.*
FROM e LEFT JOIN (SELECT {} FROM k
  UNION ALL SELECT {} FROM c WHERE NOT EXISTS (SELECT 1 FROM k)) AS r ON true",
        adopt("holder", "NULL"),
        adopt("token", "NULL"),
        adopt("pid", "NULL"),
        adopt("host", "NULL"),
        adopt("labels", "'{}'"),
        waiter("waiter", "$2", "NULL"),
        waiter("waiter_token", "$3", "NULL"),
        waiter("waiter_expires", waiter_expires, "NULL"),
        waiter("waiter_ttl_ms", "$5::bigint", "NULL"),
        waiter("waiter_write", "$12::boolean", "false"),
        seen("k.", &written_holders),
        seen("c.", &live_holders),
    )
}

impl Sql {
    /// `cleanup`'s text for rows untouched for `older_ms` milliseconds: a table lock and the
    /// delete, sent together by the simple-query protocol, so they run as one implicit
    /// transaction that no other statement on the shared connection joins.
    pub(super) fn cleanup_text(&self, older_ms: i64) -> String {
        self.cleanup.replace("{older}", &older_ms.to_string())
    }
}
