WITH r AS (UPDATE {table} SET waiter = NULL, waiter_token = NULL, waiter_expires = NULL,
  waiter_ttl_ms = NULL, waiter_write = false WHERE key = $1 AND waiter_token = $2 RETURNING 1)
SELECT pg_notify($3, $4)::text FROM r
