WITH c AS (SELECT t.*, t.xmin AS v FROM {table} AS t WHERE t.key = $1),
live AS (SELECT p.* FROM {permits} AS p WHERE p.key = $1 AND p.expires > now()),
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
ku AS (UPDATE {table} AS t SET
    holder = CASE WHEN e.adopt THEN NULL ELSE t.holder END,
    token = CASE WHEN e.adopt THEN NULL ELSE t.token END,
    pid = CASE WHEN e.adopt THEN NULL ELSE t.pid END,
    host = CASE WHEN e.adopt THEN NULL ELSE t.host END,
    labels = CASE WHEN e.adopt THEN '{}' ELSE t.labels END,
    permit_kind = $10::text, permit_count = $11::integer,
    fence = CASE WHEN e.grant THEN nextval('{sequence_text}'::regclass) ELSE t.fence END,
    waiter = CASE WHEN e.registers THEN $2 WHEN (e.grant AND e.waiter_mine) OR NOT e.waiter_live THEN NULL ELSE t.waiter END,
    waiter_token = CASE WHEN e.registers THEN $3 WHEN (e.grant AND e.waiter_mine) OR NOT e.waiter_live THEN NULL ELSE t.waiter_token END,
    waiter_expires = CASE WHEN e.registers THEN now() + $5::bigint * interval '1 millisecond' WHEN (e.grant AND e.waiter_mine) OR NOT e.waiter_live THEN NULL ELSE t.waiter_expires END,
    waiter_ttl_ms = CASE WHEN e.registers THEN $5::bigint WHEN (e.grant AND e.waiter_mine) OR NOT e.waiter_live THEN NULL ELSE t.waiter_ttl_ms END,
    waiter_write = CASE WHEN e.registers THEN $12::boolean WHEN (e.grant AND e.waiter_mine) OR NOT e.waiter_live THEN false ELSE t.waiter_write END,
    watched = t.watched OR e.marks
  FROM e WHERE t.key = $1 AND t.xmin = e.v AND (e.grant OR e.registers OR e.marks)
  RETURNING t.*),
ki AS (INSERT INTO {table} AS t (key, fence, acquired, renewed, expires, ttl_ms, waiter, waiter_token,
    waiter_expires, waiter_ttl_ms, waiter_write, permit_kind, permit_count)
  SELECT $1, nextval('{sequence_text}'::regclass), now(), now(), now(), 0,
    CASE WHEN e.registers THEN $2 END, CASE WHEN e.registers THEN $3 END,
    CASE WHEN e.registers THEN now() + $5::bigint * interval '1 millisecond' END, CASE WHEN e.registers THEN $5::bigint END,
    e.registers AND $12::boolean, $10::text, $11::integer
  FROM e WHERE e.v IS NULL AND (e.grant OR e.registers OR e.marks)
  ON CONFLICT (key) DO NOTHING
  RETURNING t.*),
k AS (SELECT * FROM ku UNION ALL SELECT * FROM ki),
ins AS (INSERT INTO {permits} AS p (key, token, holder, fence, write, acquired, renewed, expires,
    ttl_ms, pid, host, labels)
  SELECT k.key, $3, $2, k.fence, $12::boolean, now(), now(), {expires}, $4::bigint, $7::integer,
    $8, $6
  FROM k, e WHERE e.grant
  ON CONFLICT (key, token) DO UPDATE SET holder = excluded.holder, fence = excluded.fence,
    write = excluded.write, acquired = excluded.acquired, renewed = excluded.renewed,
    expires = excluded.expires, ttl_ms = excluded.ttl_ms, pid = excluded.pid,
    host = excluded.host, labels = excluded.labels
  RETURNING p.*),
gone AS (DELETE FROM {permits} AS p USING k WHERE p.key = k.key AND p.expires <= now() AND p.token <> $3)
SELECT CASE WHEN e.refused THEN 'refused'
    WHEN (e.grant OR e.registers OR e.marks) AND NOT EXISTS (SELECT 1 FROM k) THEN 'raced'
    WHEN e.grant THEN 'granted' ELSE 'held' END,
  e.lock_held, r.*
FROM e LEFT JOIN (SELECT {written_record} FROM k
  UNION ALL SELECT {snapshot_record} FROM c WHERE NOT EXISTS (SELECT 1 FROM k)) AS r ON true
