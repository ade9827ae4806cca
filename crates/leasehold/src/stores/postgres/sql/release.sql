WITH u AS (UPDATE {table} AS t SET holder = CASE WHEN t.token = $2 THEN NULL ELSE t.holder END,
  token = CASE WHEN t.token = $2 THEN NULL ELSE t.token END, renewed = now(), watched = CASE WHEN t.watched OR {live} THEN pg_notify($3, $4)::text IS NULL ELSE false END
  WHERE t.key = $1 AND (t.token = $2 OR (t.permit_kind IS NOT NULL
    AND EXISTS (SELECT 1 FROM {permits} AS p WHERE p.key = $1 AND p.token = $2)))
  RETURNING t.permit_kind IS NULL AS lock, t.expires > now() AS live),
pd AS (DELETE FROM {permits} AS p USING u WHERE NOT u.lock AND p.key = $1
  AND (p.token = $2 OR p.expires <= now())
  RETURNING p.token = $2 AND p.expires > now() AS live)
SELECT live FROM u WHERE u.lock UNION ALL SELECT live FROM pd
