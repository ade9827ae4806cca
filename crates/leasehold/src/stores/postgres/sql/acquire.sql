INSERT INTO {table} AS t (key, holder, token, fence, acquired, renewed, expires, ttl_ms, pid, host, labels)
VALUES ($1, $2, $3, {block}, now(), now(), {expires}, $4::bigint, $8::integer, $9, $6)
ON CONFLICT (key) DO UPDATE SET
  holder = CASE WHEN {granted_any} THEN excluded.holder ELSE t.holder END,
  token = CASE WHEN {granted_any} THEN excluded.token ELSE t.token END,
  fence = CASE WHEN {granted_any} THEN {block} ELSE t.fence END,
  acquired = CASE WHEN {granted_any} THEN excluded.acquired ELSE t.acquired END,
  renewed = CASE WHEN {granted_any} THEN excluded.renewed ELSE t.renewed END,
  expires = CASE WHEN {granted_any} THEN {expires} ELSE t.expires END,
  ttl_ms = CASE WHEN {granted_any} THEN excluded.ttl_ms ELSE t.ttl_ms END,
  pid = CASE WHEN {granted_any} THEN excluded.pid ELSE t.pid END,
  host = CASE WHEN {granted_any} THEN excluded.host ELSE t.host END,
  labels = CASE WHEN {granted_any} THEN excluded.labels ELSE t.labels END,
  waiter = CASE WHEN {granted_any} AND ({mine} OR NOT {live}) THEN NULL WHEN {registers} THEN $2 ELSE t.waiter END,
  waiter_token = CASE WHEN {granted_any} AND ({mine} OR NOT {live}) THEN NULL WHEN {registers} THEN $3 ELSE t.waiter_token END,
  waiter_expires = CASE WHEN {granted_any} AND ({mine} OR NOT {live}) THEN NULL WHEN {registers} THEN now() + $5::bigint * interval '1 millisecond' ELSE t.waiter_expires END,
  waiter_ttl_ms = CASE WHEN {granted_any} AND ({mine} OR NOT {live}) THEN NULL WHEN {registers} THEN $5::bigint ELSE t.waiter_ttl_ms END,
  watched = t.watched OR ($10::boolean AND NOT {granted_any})
WHERE ({granted_any} OR {registers} OR ($10::boolean AND NOT {registers} AND NOT t.watched)) AND t.permit_kind IS NULL
RETURNING {columns}, (token = $3 AND acquired = now())
