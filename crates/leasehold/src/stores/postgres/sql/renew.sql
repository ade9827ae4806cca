WITH r AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, token, ttl)),
lk AS (UPDATE {table} AS t SET renewed = now(), ttl_ms = r.ttl,
  expires = now() + r.ttl * interval '1 millisecond', {lapsed_waiter}
  FROM r
  WHERE t.key = r.key AND t.token = r.token AND t.expires > now()
  RETURNING {lock_record}, t.token),
pk AS (SELECT t.key FROM {table} AS t WHERE t.permit_kind IS NOT NULL AND t.key IN
  (SELECT r.key FROM r JOIN {permits} AS p ON p.key = r.key AND p.token = r.token AND p.expires > now())
  ORDER BY t.key FOR UPDATE OF t),
kb AS (UPDATE {table} AS t SET {lapsed_waiter}, {lapsed_write} FROM pk WHERE t.key = pk.key RETURNING t.*),
pu AS (UPDATE {permits} AS p SET renewed = now(), ttl_ms = r.ttl,
  expires = now() + r.ttl * interval '1 millisecond'
  FROM r, kb
  WHERE p.key = r.key AND p.token = r.token AND kb.key = r.key AND p.expires > now()
  RETURNING p.*)
SELECT * FROM lk
UNION ALL
SELECT {renewed_record}, pu.token FROM pu JOIN kb ON kb.key = pu.key
