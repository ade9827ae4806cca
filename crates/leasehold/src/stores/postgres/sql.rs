//! The SQL text of the PostgreSQL lock store: the table (created on first use), and one
//! statement per step, every time judged by the server's clock (`now()`, the statement's start;
//! a grant's expiry counts from `clock_timestamp()`, the grant itself).
//!
//! Each statement's text is a file in `sql/*.sql` (as the Redis store keeps its scripts in
//! `lua/`), with placeholders in braces that [`Sql::new`] fills once, in one pass ([`Values`]):
//! the names (`{schema}`, `{table}`, `{permits}`, `{sequence}`, and `{sequence_text}` for the
//! sequence as a `regclass` literal), the shared expressions below (`{held}`, `{live}`,
//! `{granted}`, …), and the record's column lists (`{columns}`, `{record}`, …), which are
//! written per table alias here. A brace that names nothing (`'{}'`) is text.
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
    /// The DDL that creates the schema ([`CREATE_SCHEMA`]).
    pub(super) create_schema: String,
    /// The DDL that creates the table and its fence sequence ([`CREATE`]).
    pub(super) create: String,
    /// The DDL that brings a table made by an earlier version up to date ([`UPGRADE`]).
    pub(super) upgrade: String,
    /// Whether the table, its schema, its columns and its permit table are there ([`EXISTS`]).
    pub(super) exists: String,
    /// `"schema"."table_permits"`: the permits held on semaphore and read-write keys, a row each.
    pub(super) permits: String,
    /// The acquisition of a free (or expired) key, or of one reserved for the caller
    /// ([`ACQUIRE_FREE`]).
    pub(super) acquire_free: String,
    /// The whole acquisition ([`ACQUIRE`]).
    pub(super) acquire: String,
    /// Many renewals ([`RENEW`]).
    pub(super) renew: String,
    /// What became of leases not renewed ([`LOST`]).
    pub(super) lost: String,
    /// A release ([`RELEASE`]).
    pub(super) release: String,
    /// A waiter's withdrawal ([`WITHDRAW`]).
    pub(super) withdraw: String,
    /// A key's whole record ([`INSPECT`]).
    pub(super) inspect: String,
    /// The records of a prefix ([`LIST`]).
    pub(super) list: String,
    /// An operator's release ([`FORCE`]).
    pub(super) force: String,
    /// Marks a held lease `watched` ([`MARK_WATCHED`]).
    pub(super) mark_watched: String,
    /// A permit acquisition ([`PERMIT_ACQUIRE`]).
    pub(super) permit_acquire: String,
    /// Makes a permit key a lock key again ([`TO_LOCK`]).
    pub(super) to_lock: String,
    /// `cleanup`'s two statements ([`CLEANUP`]), `{older}` where its age in milliseconds goes.
    cleanup: String,
    /// The sequence's name as a `regclass` literal reads it.
    pub(super) sequence: String,
}

/// The DDL that creates the schema (idempotent; run only when it is missing: `CREATE SCHEMA IF
/// NOT EXISTS` needs the right to create schemas even when the schema is there).
const CREATE_SCHEMA: &str = include_str!("sql/create_schema.sql");

/// The DDL that creates the table and its fence sequence, then [`CREATE_PERMITS`] (idempotent).
const CREATE: &str = include_str!("sql/create.sql");

/// The permits of semaphore and read-write keys, a row each. The key's row in the lease table
/// keeps what the key is (`permit_kind`, `permit_count`), its fence, its registered waiter
/// (`waiter_write`: a writer) and its `watched` mark; no lock holder.
const CREATE_PERMITS: &str = include_str!("sql/create_permits.sql");

/// The DDL that brings a table made by an earlier version up to date (idempotent): the `watched`
/// column, the permit columns and the permit table.
const UPGRADE: &str = include_str!("sql/upgrade.sql");

/// Whether the table and its sequence are there, whether the schema is, whether the table has its
/// `watched` column, and whether it has its permit columns and permit table: `$1` the table, `$2`
/// the sequence, `$4` the permit table (names as `to_regclass` reads them), `$3` the schema.
const EXISTS: &str = include_str!("sql/exists.sql");

/// The acquisition of a free (or expired) key, or of one reserved for the caller: the hot path,
/// what [`ACQUIRE`] does when it grants, and nothing else. Writes nothing otherwise (no waiter
/// registration, no mark: `watched` stays as it was, so a contender that marked a free row
/// reserved for us still waits for our release), and answers the grant's fence and times only
/// (the client knows the rest of the record). One fence only (a block goes to [`ACQUIRE`]): a
/// block's subquery costs its setup at every run, used or not. `$1` key, `$2` holder, `$3`
/// token, `$4` TTL in ms, `$5` labels, `$6` pid, `$7` host (numbered apart from [`ACQUIRE`]'s).
///
/// The fence and the expiry of a grant are taken on the locked row version, in `DO UPDATE`:
/// `VALUES` is evaluated before the arbiter check and the row lock, and a statement that stalls
/// between the two (a lock wait, a descheduled backend) would be granted a fence below one
/// granted and released meanwhile, and an expiry counted from before its wait. `VALUES` still
/// takes one for a key with no row: [`CLEANUP`] locks the table against inserts in flight, so no
/// row deleted meanwhile can be recreated with it. `clock_timestamp()` is the server's time at
/// the grant; the client counts its lease from its send, earlier still.
const ACQUIRE_FREE: &str = include_str!("sql/acquire_free.sql");

/// The whole acquisition: a grant as [`ACQUIRE_FREE`], else a waiter registration (`$5` > 0,
/// see [`REGISTERS`]) or, for a watching caller (`$10`), the mark that makes the release
/// notify; the record as it is then, and whether it was granted. `$7` fences (a block is fenced
/// with the largest), `$8` pid, `$9` host.
///
/// It also grants a key it holds already ([`REGRANT`]): an earlier attempt of the same
/// acquisition (its token) was granted and its answer lost. It is granted again, in this write,
/// with a new fence and its lease counted from now, as the holder's `valid_until` counts from
/// this attempt's send (never from the lost grant's, after which the server would free it
/// first). A live registered waiter stays.
const ACQUIRE: &str = include_str!("sql/acquire.sql");

/// Many leases in one statement: `$1` keys, `$2` tokens, `$3` TTLs in milliseconds; each row
/// answered carries its token last. A lock's row is renewed where its token is. A permit is
/// renewed in its own row, and its key's row is written too (a new row version: a permit
/// acquisition that judged the key on an older snapshot sees it changed, see [`PERMIT_ACQUIRE`]),
/// locked first and in key order, so that two batches renewing permits of the same keys never
/// wait for each other in a cycle. Its row answered is the key's, with the holders (the others
/// as this statement's snapshot has them).
const RENEW: &str = include_str!("sql/renew.sql");

/// What became of leases not renewed: `$1` keys, `$2` tokens; per key and token, who holds the
/// key, and whether a permit row of the token is still there (it expired).
const LOST: &str = include_str!("sql/lost.sql");

/// `$1` key, `$2` token, `$3` the channel, `$4` the payload (the key). It notifies only when
/// someone waits: a live registered waiter, or a watching contender whose attempt marked the
/// row (the notification queue serialises the commits of every transaction that notifies). The
/// old row decides, so the call sits in the `SET` of the mark it clears (`RETURNING` sees the
/// new row only); a `SET` evaluated again on a newer row version (a concurrent write,
/// re-checked) can notify once more for nothing, never miss one. `pg_notify`'s text is '', not
/// NULL: the mark is false either way. A lapsed waiter registration is left as it is (every
/// reader judges it by its expiry; the next grant clears it).
///
/// A permit's token (its key's row has a permit kind and a permit row of the token) writes the
/// key's row the same way, which notifies the same way, and then releases its permit row and
/// the permit rows that expired; the lock's fields stay as they are. One `UPDATE` of the key's
/// row serves both, so that a lock's release costs little more than it did before there were
/// permits. A row per release that was still live or not.
const RELEASE: &str = include_str!("sql/release.sql");

/// A waiter's withdrawal (`$1` key, `$2` its token): its registration cleared, and a
/// notification (`$3` the channel, `$4` the payload) when it was registered.
const WITHDRAW: &str = include_str!("sql/withdraw.sql");

/// The whole record of key `$1` (a permit key's holders: every permit row, lapsed ones too:
/// readers judge them by their expiry, as they judge a lock's).
const INSPECT: &str = include_str!("sql/inspect.sql");

/// The whole records of the keys that start with `$1`, in key order.
const LIST: &str = include_str!("sql/list.sql");

/// An operator frees what `$4` holds (a holder id or an owner token; NULL: whoever holds): a
/// lock's holder, as before; a permit key's matching permits (and those that expired), judged on
/// this statement's snapshot and written only if the key's row is still the version read (else
/// the row answered says `false`: the caller runs it again). One row when something was freed:
/// whether it was written, the record as it was, and the notification (`$2` the channel, `$3`
/// the payload).
const FORCE: &str = include_str!("sql/force.sql");

/// Marks a held lease (or a key with live permits) `watched`, so that its release notifies (`$1`
/// key, `$2` its fence or NULL for whichever): whether the key still has that fence (true
/// without one).
const MARK_WATCHED: &str = include_str!("sql/mark_watched.sql");

/// Free (or expired), no live waiter, no live permit, untouched (its permits included) for
/// `{older}` milliseconds; its permit rows go with it. Fences come from the sequence, which no
/// deletion lowers. The table lock first waits for every acquire in flight (an `INSERT` holds
/// ROW EXCLUSIVE from its start, before its `VALUES` take a fence) and holds off new ones until
/// the commit: an insert that took its fence before the deletion cannot recreate the key with
/// it. Every statement that writes a permit row writes its key's row too, so the lock holds
/// those off as well. Sent by the simple-query protocol (see [`Sql::cleanup`]).
const CLEANUP: &str = include_str!("sql/cleanup.sql");

/// Makes a permit key with no live holder and no live waiter a lock key again (`$1` key): a row
/// (whether the key is busy, its kind, its count, whether it was made a lock) when the key is a
/// permit key.
const TO_LOCK: &str = include_str!("sql/to_lock.sql");

/// A permit acquisition, judged and written in one statement: `$1` key, `$2` holder, `$3` token,
/// `$4` TTL in ms, `$5` waiter TTL in ms (0: none), `$6` labels, `$7` pid, `$8` host, `$9`
/// watching, `$10` the kind (`semaphore`, `read-write`), `$11` the semaphore's count (NULL for a
/// read-write lock), `$12` whether it is a write. One row: the outcome (`refused`, `raced`,
/// `granted`, `held`), whether a lock holds the key, then the record ([`full`]).
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
/// semaphore of `n` grants while the live holders, the registered waiter (if live and another's)
/// and the caller are at most `n`; a writer only with no live holder and no other live
/// registered waiter; a reader with no live writer holding, no writer registered as waiter, and
/// fewer than `PERMIT_LIMIT` holders and waiter together. A request of another kind or count than
/// the key's while it has a live holder or waiter (or a live lock holder) is `refused`; a key
/// with neither takes the kind asked, keeping its fence. A grant's fence is the sequence's next
/// value, taken on the locked row (as a lock grant's), and the key's row keeps the last one. A
/// registration, or the caller's own, is cleared when the caller is granted or when it lapsed;
/// a key that takes a kind is no lock any more: its lock holder's part goes.
const PERMIT_ACQUIRE: &str = include_str!("sql/permit_acquire.sql");

/// `{held}`: a held lease, an owner token not yet expired, on the server's clock.
const HELD: &str = "coalesce(t.token IS NOT NULL AND t.expires > now(), false)";
/// `{live}`: a live waiter registration.
const LIVE: &str = "coalesce(t.waiter_token IS NOT NULL AND t.waiter_expires > now(), false)";
/// `{mine}`: the live waiter registration is the caller's (`$3`, its token).
const MINE: &str = "coalesce(t.waiter_token = $3, false)";
/// `{granted}`: free, or reserved for the caller.
const GRANTED: &str = "(NOT {held} AND NOT ({live} AND NOT {mine}))";
/// `{regrant}`: held by the caller's own token (an earlier attempt's lost grant).
const REGRANT: &str = "({held} AND coalesce(t.token = $3, false))";
/// `{granted_any}`: what [`ACQUIRE`] grants.
const GRANTED_ANY: &str = "({regrant} OR {granted})";
/// `{fresh}`: the caller's own registration, with two thirds of its TTL still to run.
const FRESH: &str = "({mine} AND {live} AND t.waiter_expires >= now() + ($5::bigint * 2 / 3) * interval '1 millisecond')";
/// `{registers}`: the caller registers as the waiter (or refreshes its registration).
const REGISTERS: &str = "($5::bigint > 0 AND ({mine} OR NOT {live}) AND NOT {fresh})";
/// `{expires}`: a grant's expiry, counted from the grant (`$4` its TTL in ms).
const EXPIRES: &str = "clock_timestamp() + $4::bigint * interval '1 millisecond'";
/// `{block}`: one value of the sequence, or the largest of `$7` values for a block.
const BLOCK: &str = "(CASE WHEN $7::bigint = 1 THEN nextval('{sequence_text}'::regclass) \
     ELSE (SELECT max(nextval('{sequence_text}'::regclass)) FROM generate_series(1, $7::bigint)) END)";
/// `{lapsed_waiter}`: a lapsed waiter registration cleared.
const LAPSED_WAITER: &str = "waiter = CASE WHEN {live} THEN t.waiter END, \
     waiter_token = CASE WHEN {live} THEN t.waiter_token END, \
     waiter_expires = CASE WHEN {live} THEN t.waiter_expires END, \
     waiter_ttl_ms = CASE WHEN {live} THEN t.waiter_ttl_ms END";
/// `{lapsed_write}`: the waiter's write flag goes with a lapsed registration.
const LAPSED_WRITE: &str = "waiter_write = CASE WHEN {live} THEN t.waiter_write ELSE false END";

/// The values of a text's placeholders, by name, filled in one pass: a value is never read for
/// placeholders again.
struct Values(Vec<(&'static str, String)>);

impl Values {
    /// `text` (its trailing newline left out) with each `{name}` of a value replaced by it.
    fn fill(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() * 2);
        let mut rest = text.trim_end();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            let value = after.find('}').and_then(|close| {
                let name = &after[..close];
                let found = self.0.iter().find(|(n, _)| *n == name);
                found.map(|(_, value)| (value, close))
            });
            match value {
                Some((value, close)) => {
                    out.push_str(value);
                    rest = &after[close + 1..];
                }
                None => {
                    out.push('{');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Adds `name`, its value `text` filled with the values so far.
    fn add(&mut self, name: &'static str, text: &str) {
        let value = self.fill(text);
        self.0.push((name, value));
    }
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

impl Values {
    /// The names of table `table` in schema `schema` (both checked identifiers), the shared
    /// expressions and the record column lists.
    fn new(schema: &str, table: &str) -> Self {
        let sequence = format!("\"{schema}\".\"{table}_fence\"");
        let mut v = Values(vec![
            ("schema", format!("\"{schema}\"")),
            ("table", format!("\"{schema}\".\"{table}\"")),
            ("permits", format!("\"{schema}\".\"{table}_permits\"")),
            ("sequence_text", sequence.replace('\'', "''")),
            ("sequence", sequence),
            ("limit", crate::record::PERMIT_LIMIT.to_string()),
        ]);
        let parts = [
            ("held", HELD),
            ("live", LIVE),
            ("mine", MINE),
            ("granted", GRANTED),
            ("regrant", REGRANT),
            ("granted_any", GRANTED_ANY),
            ("fresh", FRESH),
            ("registers", REGISTERS),
            ("expires", EXPIRES),
            ("block", BLOCK),
            ("lapsed_waiter", LAPSED_WAITER),
            ("lapsed_write", LAPSED_WRITE),
            ("create_permits", CREATE_PERMITS),
        ];
        for (name, text) in parts {
            v.add(name, text);
        }
        // The record column lists: of the lease table alone; of a lock's row (no holders); of a
        // permit key with every permit row; of a key's row renewed with its renewed permits; of
        // a force-released permit key; of a permit key written, and as the snapshot read it.
        let renewed = "(SELECT y.* FROM {permits} AS y WHERE y.key = kb.key AND y.expires > now() \
             AND NOT EXISTS (SELECT 1 FROM pu AS z WHERE z.key = y.key AND z.token = y.token) \
             UNION ALL SELECT z.* FROM pu AS z WHERE z.key = kb.key) AS x";
        let all = "{permits} AS x WHERE x.key = t.key";
        let written =
            "(SELECT * FROM live WHERE live.token <> $3 UNION ALL SELECT * FROM ins) AS x";
        let lists = [
            ("columns", columns("")),
            ("lock_record", full("t.", "NULL::text")),
            (
                "record",
                full(
                    "t.",
                    &format!(
                        "CASE WHEN t.permit_kind IS NOT NULL THEN {} END",
                        holders(&v.fill(all))
                    ),
                ),
            ),
            ("renewed_record", full("kb.", &holders(&v.fill(renewed)))),
            ("forced_permit_record", full("pc.", &holders("po AS x"))),
            ("written_record", seen("k.", &holders(written))),
            ("snapshot_record", seen("c.", &holders("live AS x"))),
        ];
        v.0.extend(lists);
        v
    }
}

impl Sql {
    /// The statements of table `table` in schema `schema` (both checked identifiers).
    pub(super) fn new(schema: &str, table: &str) -> Self {
        let v = Values::new(schema, table);
        let name = |name: &str| v.fill(&format!("{{{name}}}"));
        Sql {
            schema: name("schema"),
            table: name("table"),
            permits: name("permits"),
            sequence: name("sequence"),
            create_schema: v.fill(CREATE_SCHEMA),
            create: v.fill(CREATE),
            upgrade: v.fill(UPGRADE),
            exists: v.fill(EXISTS),
            acquire_free: v.fill(ACQUIRE_FREE),
            acquire: v.fill(ACQUIRE),
            renew: v.fill(RENEW),
            lost: v.fill(LOST),
            release: v.fill(RELEASE),
            withdraw: v.fill(WITHDRAW),
            inspect: v.fill(INSPECT),
            list: v.fill(LIST),
            force: v.fill(FORCE),
            mark_watched: v.fill(MARK_WATCHED),
            permit_acquire: v.fill(PERMIT_ACQUIRE),
            to_lock: v.fill(TO_LOCK),
            cleanup: v.fill(CLEANUP),
        }
    }

    /// `cleanup`'s text for rows untouched for `older_ms` milliseconds: a table lock and the
    /// delete, sent together by the simple-query protocol, so they run as one implicit
    /// transaction that no other statement on the shared connection joins.
    pub(super) fn cleanup(&self, older_ms: i64) -> String {
        self.cleanup.replace("{older}", &older_ms.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::Sql;

    /// Every text of `sql`, named, `cleanup`'s for rows untouched for 1234 ms.
    fn statements(sql: &Sql) -> Vec<(&'static str, String)> {
        vec![
            ("schema", sql.schema.clone()),
            ("table", sql.table.clone()),
            ("permits", sql.permits.clone()),
            ("sequence", sql.sequence.clone()),
            ("create_schema", sql.create_schema.clone()),
            ("create", sql.create.clone()),
            ("upgrade", sql.upgrade.clone()),
            ("exists", sql.exists.clone()),
            ("acquire_free", sql.acquire_free.clone()),
            ("acquire", sql.acquire.clone()),
            ("renew", sql.renew.clone()),
            ("lost", sql.lost.clone()),
            ("release", sql.release.clone()),
            ("withdraw", sql.withdraw.clone()),
            ("inspect", sql.inspect.clone()),
            ("list", sql.list.clone()),
            ("force", sql.force.clone()),
            ("mark_watched", sql.mark_watched.clone()),
            ("permit_acquire", sql.permit_acquire.clone()),
            ("to_lock", sql.to_lock.clone()),
            ("cleanup", sql.cleanup(1234)),
        ]
    }

    /// The `{name}` placeholders left in `text`.
    fn placeholders(text: &str) -> Vec<&str> {
        text.split('{')
            .skip(1)
            .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
            .filter(|name| {
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            })
            .collect()
    }

    #[test]
    fn names_that_read_like_sql_and_placeholders_are_filled_in_quoted() {
        // Valid identifiers, each a keyword or a placeholder's name: written once, quoted,
        // never read again for placeholders.
        let sql = Sql::new("table", "sequence");
        for (name, text) in statements(&sql) {
            assert_eq!(placeholders(&text), Vec::<&str>::new(), "{name}: {text}");
            assert_eq!(text.matches('"').count() % 2, 0, "{name}: {text}");
            assert!(!text.ends_with('\n'), "{name}");
            assert!(!text.contains("\"table\".sequence"), "{name}: {text}");
        }
        assert_eq!(sql.table, "\"table\".\"sequence\"");
        assert_eq!(sql.permits, "\"table\".\"sequence_permits\"");
        assert_eq!(sql.sequence, "\"table\".\"sequence_fence\"");
        assert_eq!(sql.create_schema, "CREATE SCHEMA IF NOT EXISTS \"table\";");
        assert!(sql.cleanup(1234).contains("+ 1234::bigint * interval"));
        assert!(sql.create.contains("labels TEXT NOT NULL DEFAULT '{}',"));
        assert!(sql.permit_acquire.contains("f.held + f.ahead < 64"));
        assert_eq!(
            sql.acquire_free,
            "INSERT INTO \"table\".\"sequence\" AS t (key, holder, token, fence, acquired, renewed, expires, ttl_ms, pid, host, labels)
VALUES ($1, $2, $3, nextval('\"table\".\"sequence_fence\"'::regclass), now(), now(), clock_timestamp() + $4::bigint * interval '1 millisecond', $4::bigint, $6::integer, $7, $5)
ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, token = excluded.token,
  fence = nextval('\"table\".\"sequence_fence\"'::regclass), acquired = now(), renewed = now(), expires = clock_timestamp() + $4::bigint * interval '1 millisecond',
  ttl_ms = excluded.ttl_ms, pid = excluded.pid, host = excluded.host, labels = excluded.labels,
  waiter = NULL, waiter_token = NULL, waiter_expires = NULL, waiter_ttl_ms = NULL
WHERE (NOT coalesce(t.token IS NOT NULL AND t.expires > now(), false) AND NOT (coalesce(t.waiter_token IS NOT NULL AND t.waiter_expires > now(), false) AND NOT coalesce(t.waiter_token = $3, false))) AND t.permit_kind IS NULL
RETURNING fence, acquired, expires"
        );
    }
}
