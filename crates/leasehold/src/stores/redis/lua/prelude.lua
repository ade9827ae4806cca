local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A record as a table, nil (none) or 'corrupt': not a record of ours (another client's lock
-- token, JSON without our key and fence, or an error table from `redis.pcall`: a value of
-- another type).
local function decode(raw)
  if not raw then return nil end
  local ok, r = pcall(cjson.decode, raw)
  if ok and type(r) == 'table' and type(r.key) == 'string' and type(r.fence) == 'number' then return r end
  return 'corrupt'
end
-- A value we cannot read under `k` is another client's lock, held until the server expires it:
-- {2, its type, its PTTL in ms (-1: no TTL, held until deleted), now, its length (-1: not a
-- string)}. It is never replaced.
local function foreign(k, raw)
  local kind = redis.call('TYPE', k)
  if type(kind) == 'table' then kind = kind.ok end
  local len = -1
  if type(raw) == 'string' then len = #raw end
  return {2, kind, redis.call('PTTL', k), now, len}
end
local function str(v) if v == nil or v == cjson.null then return nil end return v end
local function num(v) if v == nil or v == cjson.null then return 0 end return tonumber(v) or 0 end
local function live_waiter(r) return str(r.waiter_token) ~= nil and num(r.waiter_expires) > now end
local function held(r) return str(r.token) ~= nil and num(r.expires) > now end
local function clear_waiter(r) r.waiter = cjson.null; r.waiter_token = cjson.null; r.waiter_expires = cjson.null; r.waiter_ttl_ms = nil end
-- The waiters in line behind the registered one, in arrival order ({holder, token, expires,
-- ttl_ms} each). An empty line is no field: cjson writes an empty table as an object.
local function line(r) if type(r.queue) == 'table' then return r.queue end return {} end
-- Drops the lapsed places of the line and, when the registered waiter is gone, makes the first
-- queued one the registered waiter. True when it changed anything.
local function tidy(r)
  local q, changed = {}, false
  for _, w in ipairs(line(r)) do
    if type(w) == 'table' and num(w.expires) > now and str(w.token) ~= str(r.waiter_token) then
      q[#q + 1] = w
    else
      changed = true
    end
  end
  if str(r.waiter_token) ~= nil and not live_waiter(r) then
    clear_waiter(r); changed = true
  end
  if str(r.waiter_token) == nil and #q > 0 then
    local w = table.remove(q, 1)
    r.waiter = w.holder; r.waiter_token = w.token; r.waiter_expires = w.expires; r.waiter_ttl_ms = w.ttl_ms
    changed = true
  end
  if #q > 0 then r.queue = q else r.queue = nil end
  return changed
end
-- Where `token` stands in line: 0 the registered waiter, i the i-th queued one, nil nowhere.
local function place(r, token)
  if str(r.waiter_token) == token then return 0 end
  for i, w in ipairs(line(r)) do if w.token == token then return i end end
  return nil
end
-- The permit table of a semaphore's or read-write lock's record ({kind, permits, holders,
-- writers_waiting}), nil for a lock's. On such a record the lock fields hold nobody: `fence` is
-- the last fence the key issued, and the line waits for permits.
local function permits(r) if type(r.permits) == 'table' then return r.permits end return nil end
-- A permit table's holders in the order they were granted ({holder, token, fence, write,
-- acquired, renewed, expires, ttl_ms, pid, host, labels} each).
local function holders(t) if type(t.holders) == 'table' then return t.holders end return {} end
-- Drops a permit table's lapsed holders (each permit expires on its own, by the server's clock)
-- and the waiting writers no longer in line; call it after `tidy`. True when it changed anything.
local function tidy_permits(r)
  local t = permits(r)
  if t == nil then return false end
  local kept, changed = {}, type(t.holders) ~= 'table'
  for _, h in ipairs(holders(t)) do
    if type(h) == 'table' and num(h.expires) > now then kept[#kept + 1] = h else changed = true end
  end
  t.holders = kept
  if t.writers_waiting ~= nil then
    local ww = {}
    if type(t.writers_waiting) == 'table' then
      for _, w in ipairs(t.writers_waiting) do
        if place(r, w) ~= nil then ww[#ww + 1] = w else changed = true end
      end
    end
    -- An empty list is no field (see `line`).
    if #ww > 0 then t.writers_waiting = ww else t.writers_waiting = nil; changed = true end
  end
  return changed
end
-- The record as JSON that serde reads back. cjson writes an empty table as an object: an empty
-- permit list goes out as `[]`. It writes numbers with 14 significant digits: a fence from 1e14
-- up goes out as '%d' writes it. Both are marked as strings for cjson, then unmarked.
local function encode(r)
  local big = {}
  local function mark(e)
    if num(e.fence) >= 1e14 then
      big[#big + 1] = {e, e.fence}
      e.fence = '\1' .. string.format('%d', e.fence)
    end
  end
  mark(r)
  local t = permits(r)
  local empty = t ~= nil and #holders(t) == 0
  if t ~= nil then for _, h in ipairs(holders(t)) do if type(h) == 'table' then mark(h) end end end
  if empty then t.holders = '\1[]' end
  local raw = cjson.encode(r)
  if empty then
    t.holders = {}
    raw = string.gsub(raw, '"holders":"\\u0001%[%]"', '"holders":[]', 1)
  end
  if #big > 0 then
    for _, b in ipairs(big) do b[1].fence = b[2] end
    raw = string.gsub(raw, '"fence":"\\u0001(%d+)"', '"fence":%1')
  end
  return raw
end
-- Store the record; the key lives while the lease, a permit or a waiter registration does.
local function put(r, k)
  local until_ms = 0
  if held(r) then until_ms = num(r.expires) end
  if live_waiter(r) then until_ms = math.max(until_ms, num(r.waiter_expires)) end
  for _, w in ipairs(line(r)) do until_ms = math.max(until_ms, num(w.expires)) end
  local t = permits(r)
  if t ~= nil then
    for _, h in ipairs(holders(t)) do
      if type(h) == 'table' then until_ms = math.max(until_ms, num(h.expires)) end
    end
  end
  local raw = encode(r)
  if until_ms > now then
    redis.call('SET', k, raw, 'PX', until_ms - now)
  else
    redis.call('DEL', k)
  end
  return raw
end
local function freed(r)
  r.holder = cjson.null; r.token = cjson.null; r.expires = 0; r.renewed = now; r.unclaimed = nil
  tidy(r)
  return r
end
-- The release is the grant: makes the live registered waiter of the freed record `r` its holder,
-- unclaimed, with the next fence from the counter `fk`, for what is left of its place (the
-- place's lifetime as the TTL), until its next acquire attempt claims it; the next in line moves
-- up. Returns the granted token, or nil when nobody is in line.
local function grant_first(r, fk)
  if not live_waiter(r) then return nil end
  local t = str(r.waiter_token)
  local ttl = num(r.waiter_ttl_ms)
  if ttl <= 0 then ttl = math.max(num(r.ttl_ms), 5000) end
  r.fence = redis.call('INCRBY', fk, 1)
  r.holder = r.waiter; r.token = t; r.acquired = now; r.renewed = now
  r.expires = num(r.waiter_expires); r.ttl_ms = ttl
  r.pid = cjson.null; r.host = cjson.null; r.labels = {}; r.unclaimed = true
  clear_waiter(r); tidy(r)
  return t
end
-- Publishes a release of `k`: the granted token, if the release granted the lease, so that only
-- its waiter wakes; else 'released', which wakes every waiter.
local function publish_release(k, granted)
  if granted then redis.call('PUBLISH', k, 'granted:' .. granted) else redis.call('PUBLISH', k, 'released') end
end
