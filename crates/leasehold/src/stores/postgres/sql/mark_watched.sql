WITH m AS (UPDATE {table} AS t SET watched = true WHERE t.key = $1
  AND ({held} OR (t.permit_kind IS NOT NULL
    AND EXISTS (SELECT 1 FROM {permits} AS p WHERE p.key = t.key AND p.expires > now())))
  AND NOT t.watched AND ($2::bigint IS NULL OR t.fence = $2) RETURNING 1)
SELECT $2::bigint IS NULL OR EXISTS (SELECT 1 FROM {table} AS t WHERE t.key = $1 AND t.fence = $2)
