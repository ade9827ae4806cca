LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE;
WITH d AS (DELETE FROM {table} AS t WHERE NOT {held} AND NOT {live}
  AND NOT EXISTS (SELECT 1 FROM {permits} AS p WHERE p.key = t.key AND p.expires > now())
  AND greatest(t.renewed, t.acquired, CASE WHEN t.token IS NOT NULL THEN t.expires END,
      (SELECT max(greatest(p.renewed, p.expires)) FROM {permits} AS p WHERE p.key = t.key))
      + {older}::bigint * interval '1 millisecond' <= now()
  RETURNING t.key),
dp AS (DELETE FROM {permits} AS p USING d WHERE p.key = d.key)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM {table})
