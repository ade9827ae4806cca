WITH old AS (SELECT {lock_record} FROM {table} AS t
  WHERE t.key = $1 AND t.token IS NOT NULL AND ($4::text IS NULL OR t.holder = $4 OR t.token = $4)
  FOR UPDATE),
up AS (UPDATE {table} AS t SET holder = NULL, token = NULL, renewed = now(), watched = false,
  {lapsed_waiter}
  FROM old WHERE t.key = old.key RETURNING 1),
pc AS (SELECT t.*, t.xmin AS v FROM {table} AS t
  WHERE t.key = $1 AND t.permit_kind IS NOT NULL AND t.token IS NULL),
po AS (SELECT p.* FROM {permits} AS p WHERE p.key = $1 AND EXISTS (SELECT 1 FROM pc)),
pm AS (SELECT po.token FROM po WHERE $4::text IS NULL OR po.holder = $4 OR po.token = $4),
pk AS (UPDATE {table} AS t SET renewed = now(), watched = false, {lapsed_waiter}, {lapsed_write}
  FROM pc WHERE t.key = pc.key AND t.xmin = pc.v AND EXISTS (SELECT 1 FROM pm) RETURNING t.key),
pd AS (DELETE FROM {permits} AS p USING pk
  WHERE p.key = pk.key AND (p.token IN (SELECT pm.token FROM pm) OR p.expires <= now()) RETURNING 1)
SELECT true, old.*, pg_notify($2, $3)::text FROM old
UNION ALL
SELECT EXISTS (SELECT 1 FROM pk), {forced_permit_record},
  CASE WHEN EXISTS (SELECT 1 FROM pk) THEN pg_notify($2, $3)::text END
FROM pc WHERE EXISTS (SELECT 1 FROM pm)
