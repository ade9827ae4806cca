-- ARGV: a holder id or the owner token of one acquisition.
local who = ARGV[1]
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' then return false end
local r = decode(raw)
if type(r) ~= 'table' then return false end
local t = permits(r)
if t ~= nil then
  -- A semaphore or read-write key: the permits `who` holds are freed, the others kept.
  local kept = {}
  for _, h in ipairs(holders(t)) do
    if not (type(h) == 'table' and (h.holder == who or h.token == who)) then kept[#kept + 1] = h end
  end
  if #kept == #holders(t) then return false end
  t.holders = kept; r.renewed = now
  tidy(r); tidy_permits(r)
  put(r, KEYS[1])
else
  -- A lock: freed when `who` holds it.
  if str(r.token) == nil or (str(r.holder) ~= who and r.token ~= who) then return false end
  put(freed(r), KEYS[1])
end
redis.call('PUBLISH', KEYS[1], 'force-released')
-- The record as it was.
return raw
