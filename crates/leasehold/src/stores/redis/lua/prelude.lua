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
-- Store the record; the key lives while the lease or a waiter registration does.
local function put(r, k)
  local until_ms = 0
  if held(r) then until_ms = num(r.expires) end
  if live_waiter(r) then until_ms = math.max(until_ms, num(r.waiter_expires)) end
  for _, w in ipairs(line(r)) do until_ms = math.max(until_ms, num(w.expires)) end
  local raw = cjson.encode(r)
  -- cjson writes numbers with 14 significant digits: a larger fence is put back exactly.
  if num(r.fence) >= 1e14 then
    raw = string.gsub(raw, '"fence":[^,}]*', '"fence":' .. string.format('%d', r.fence), 1)
  end
  if until_ms > now then
    redis.call('SET', k, raw, 'PX', until_ms - now)
  else
    redis.call('DEL', k)
  end
  return raw
end
local function freed(r)
  r.holder = cjson.null; r.token = cjson.null; r.expires = 0; r.renewed = now
  tidy(r)
  return r
end
