INSERT INTO {table} AS t (key, holder, token, fence, acquired, renewed, expires, ttl_ms, pid, host, labels)
VALUES ($1, $2, $3, nextval('{sequence_text}'::regclass), now(), now(), {expires}, $4::bigint, $6::integer, $7, $5)
ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, token = excluded.token,
  fence = nextval('{sequence_text}'::regclass), acquired = now(), renewed = now(), expires = {expires},
  ttl_ms = excluded.ttl_ms, pid = excluded.pid, host = excluded.host, labels = excluded.labels,
  waiter = NULL, waiter_token = NULL, waiter_expires = NULL, waiter_ttl_ms = NULL
WHERE {granted} AND t.permit_kind IS NULL
RETURNING fence, acquired, expires
