WITH c AS (SELECT t.xmin AS v, t.permit_kind, t.permit_count,
    coalesce(t.waiter_token IS NOT NULL AND t.waiter_expires > now(), false)
    OR EXISTS (SELECT 1 FROM {permits} AS p WHERE p.key = t.key AND p.expires > now()) AS busy
  FROM {table} AS t WHERE t.key = $1 AND t.permit_kind IS NOT NULL),
up AS (UPDATE {table} AS t SET permit_kind = NULL, permit_count = NULL, waiter_write = false
  FROM c WHERE t.key = $1 AND t.xmin = c.v AND NOT c.busy RETURNING t.key),
del AS (DELETE FROM {permits} AS p USING up WHERE p.key = up.key)
SELECT c.busy, c.permit_kind, c.permit_count, EXISTS (SELECT 1 FROM up) FROM c
