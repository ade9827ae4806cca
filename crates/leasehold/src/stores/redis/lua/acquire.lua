-- The caller's holder and token, from the record it sent (its head is JSON once closed).
local me = cjson.decode(ARGV[1] .. '0}')
local token = me.token
-- The waiter registration's lifetime (0: none); negative: register only where nobody else
-- waits, without a line (a Redlock node: lines kept apart on each node could each put another
-- waiter first, and no waiter would win a majority).
local wttl = tonumber(ARGV[5])
local in_line = wttl > 0
wttl = math.abs(wttl)
local r = decode(raw)
if r == 'corrupt' then return foreign(KEYS[1], raw) end
local at = nil
if type(r) == 'table' and permits(r) ~= nil then
  -- A semaphore or read-write key (see acquire_permit.lua): while it has a holder or a waiter, a
  -- lock request is refused with what the key is ({3, kind, permit count}); with neither, it is
  -- a lock again, and keeps its fence.
  tidy(r); tidy_permits(r)
  if #holders(r.permits) > 0 or str(r.waiter_token) ~= nil then
    return {3, tostring(r.permits.kind), num(r.permits.permits)}
  end
  r.permits = nil
end
if type(r) == 'table' then
  local write = tidy(r)
  at = place(r, token)
  if held(r) and str(r.token) == token then
    -- Ours already: an earlier attempt of this acquisition was granted and its answer lost.
    -- Granted again as a renewal, in this write: the lease counts from now, as the holder's
    -- `valid_until` counts from this attempt's send, never from the lost grant's.
    local ttl = tonumber(ARGV[3])
    if at == 0 then clear_waiter(r); tidy(r) elseif at ~= nil then table.remove(r.queue, at) end
    if r.unclaimed == true then
      -- Granted by the previous holder's release: claimed with our holder, process and labels,
      -- and, for a block of fences, a new block above the grant's one fence.
      local n = tonumber(ARGV[4])
      if n > 1 then r.fence = redis.call('INCRBY', KEYS[2], n) end
      local mine = cjson.decode(ARGV[1] .. '0,"acquired":0,"renewed":0,"expires":0' .. ARGV[2])
      r.holder = mine.holder; r.pid = mine.pid; r.host = mine.host; r.labels = mine.labels
      r.acquired = now; r.unclaimed = nil
    end
    r.renewed = now; r.expires = now + ttl; r.ttl_ms = ttl
    return {1, put(r, KEYS[1])}
  end
  if held(r) or (str(r.waiter_token) ~= nil and at ~= 0) then
    local due = now + math.floor(wttl * 2 / 3)
    if wttl > 0 and at == 0 then
      -- Our registration, renewed once a third of it has passed.
      if num(r.waiter_expires) < due then
        r.waiter = me.holder; r.waiter_expires = now + wttl; r.waiter_ttl_ms = wttl; write = true
      end
    elseif wttl > 0 and at ~= nil then
      local w = r.queue[at]
      if num(w.expires) < due then w.expires = now + wttl; w.ttl_ms = wttl; write = true end
    elseif wttl > 0 and str(r.waiter_token) == nil then
      r.waiter = me.holder; r.waiter_token = token; r.waiter_expires = now + wttl; r.waiter_ttl_ms = wttl
      at = 0; write = true
    elseif in_line and #line(r) < 63 then
      local q = line(r)
      q[#q + 1] = {holder = me.holder, token = token, expires = now + wttl, ttl_ms = wttl}
      r.queue = q
      at = #q; write = true
    end
    if at == nil and ARGV[6] == '1' and r.watched ~= true then
      r.watched = true; write = true
    end
    if write then raw = put(r, KEYS[1]) end
    return {0, raw}
  end
end
local fence = redis.call('INCRBY', KEYS[2], ARGV[4])
local ttl = tonumber(ARGV[3])
local g = cjson.decode(ARGV[1] .. string.format('%d', fence) .. ',"acquired":' .. now
  .. ',"renewed":' .. now .. ',"expires":' .. (now + ttl) .. ARGV[2])
if type(r) == 'table' then
  -- The line stays, less us: the next in it becomes the registered waiter.
  if at == 0 then clear_waiter(r); tidy(r) end
  if str(r.waiter_token) ~= nil then
    g.waiter = r.waiter; g.waiter_token = r.waiter_token; g.waiter_expires = r.waiter_expires
    g.waiter_ttl_ms = r.waiter_ttl_ms
  end
  g.queue = r.queue
  -- Contenders that marked the record still wait: our release must publish for them.
  if r.watched == true then g.watched = true end
end
return {1, put(g, KEYS[1])}
