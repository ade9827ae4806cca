-- The permit asked for: holder, token, write (a read-write lock's writer), ttl_ms, pid, host,
-- labels; its fence and times are added here.
local me = cjson.decode(ARGV[2])
local token, kind, count = me.token, ARGV[3], tonumber(ARGV[4])
local wttl = tonumber(ARGV[5])
local raw = redis.pcall('GET', KEYS[1])
local r = decode(raw)
if r == 'corrupt' then return foreign(KEYS[1], raw) end
if r == nil then
  -- A key never used (or forgotten by the server): free, and its fence comes from the counter.
  r = {key = ARGV[1], holder = cjson.null, token = cjson.null, fence = 0, acquired = 0,
    renewed = 0, expires = 0, ttl_ms = 0, waiter = cjson.null, waiter_token = cjson.null,
    waiter_expires = cjson.null, pid = cjson.null, host = cjson.null, labels = {}}
end
-- What is written back, if anything, and what the caller is answered: {code, record}.
local write = false
local function answer(code)
  if write then return {code, put(r, KEYS[1])} end
  return {code, encode(r)}
end
-- A lock held on the key keeps it a lock (judged before the line is tidied).
local lock_held = held(r)
if tidy(r) then write = true end
if tidy_permits(r) then write = true end
local t = permits(r)
local busy = lock_held or str(r.waiter_token) ~= nil or (t ~= nil and #t.holders > 0)
-- One kind per key: a request of another kind (or count) than the key's while the key has a
-- holder or a waiter is refused with what the key is ({3, kind, permit count}).
if lock_held then return {3, 'lock', 0} end
if t ~= nil and (t.kind ~= kind or (kind == 'semaphore' and num(t.permits) ~= count)) then
  if busy then return {3, tostring(t.kind), num(t.permits)} end
  t = nil
end
if t == nil then
  if busy then return {3, 'lock', 0} end
  -- Nobody holds or waits: the key takes the kind asked, and keeps its fence.
  r.holder = cjson.null; r.token = cjson.null; r.expires = 0
  t = {kind = kind, holders = {}}
  if kind == 'semaphore' then t.permits = count end
  r.permits = t; write = true
end
-- Ours already (an earlier attempt was granted and its answer lost): granted again as a
-- renewal, in this write, so that the permit counts from now, as its holder's `valid_until`
-- counts from this attempt's send.
for _, h in ipairs(t.holders) do
  if h.token == token then
    h.renewed = now; h.expires = now + me.ttl_ms; h.ttl_ms = me.ttl_ms
    write = true
    return answer(1)
  end
end
-- The line in order (the registered waiter, then the queue), and how many stand ahead of us:
-- all of it when we stand nowhere in it.
local at = place(r, token)
local tokens = {}
if str(r.waiter_token) ~= nil then tokens[1] = r.waiter_token end
for _, w in ipairs(line(r)) do tokens[#tokens + 1] = w.token end
local ahead = at or #tokens
local writers = {}
if type(t.writers_waiting) == 'table' then
  for _, w in ipairs(t.writers_waiting) do writers[w] = true end
end
local writer_ahead, writer_holds = false, false
for i = 1, ahead do if writers[tokens[i]] then writer_ahead = true end end
for _, h in ipairs(t.holders) do if h.write == true then writer_holds = true end end
-- Granted when the permits free now suffice for us and for every waiter ahead of us: a
-- semaphore while holders + ahead + 1 <= its count; a writer only with no holder and nobody
-- ahead; a reader with no writer holding or waiting ahead of it (a waiting writer blocks new
-- readers, so writers are not starved), and at most 64 (PERMIT_LIMIT) readers at once.
local grant
if me.write == true then
  grant = #t.holders == 0 and ahead == 0
elseif kind == 'read-write' then
  grant = not writer_holds and not writer_ahead and #t.holders + ahead < 64
else
  grant = #t.holders + ahead < count
end
if not grant then
  -- We wait: with a waiter lifetime, in the key's line, as a lock's waiters do (a place renewed
  -- once a third of it has passed; a new one at the end, at most 63 behind the registered
  -- waiter).
  if wttl > 0 then
    local due = now + math.floor(wttl * 2 / 3)
    if at == 0 then
      if num(r.waiter_expires) < due then
        r.waiter = me.holder; r.waiter_expires = now + wttl; r.waiter_ttl_ms = wttl; write = true
      end
    elseif at ~= nil then
      local w = r.queue[at]
      if num(w.expires) < due then w.expires = now + wttl; w.ttl_ms = wttl; write = true end
    elseif str(r.waiter_token) == nil then
      r.waiter = me.holder; r.waiter_token = token; r.waiter_expires = now + wttl; r.waiter_ttl_ms = wttl
      at = 0; write = true
    elseif #line(r) < 63 then
      local q = line(r)
      q[#q + 1] = {holder = me.holder, token = token, expires = now + wttl, ttl_ms = wttl}
      r.queue = q
      at = #q; write = true
    end
  end
  -- A waiting writer is noted, so that the readers behind it wait too.
  if me.write == true and at ~= nil and not writers[token] then
    local ww = {}
    if type(t.writers_waiting) == 'table' then ww = t.writers_waiting end
    ww[#ww + 1] = token
    t.writers_waiting = ww; write = true
  end
  -- A subscribed contender without a place: the next release must publish for it.
  if at == nil and ARGV[6] == '1' and r.watched ~= true then
    r.watched = true; write = true
  end
  return answer(0)
end
-- Granted: the key's next fence (the counter the lock scripts take theirs from), and we leave
-- the line (the next in it moves up).
local fence = redis.call('INCRBY', KEYS[2], 1)
r.fence = fence
if at == 0 then clear_waiter(r) elseif at ~= nil then table.remove(r.queue, at) end
tidy(r); tidy_permits(r)
me.fence = fence; me.acquired = now; me.renewed = now; me.expires = now + me.ttl_ms
t.holders[#t.holders + 1] = me
write = true
return answer(1)
