local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' then return false end
local r = decode(raw)
if type(r) ~= 'table' then return raw or false end
local t = permits(r)
if t ~= nil then
  -- A semaphore or read-write key: every permit is freed; the line stays.
  if #holders(t) > 0 then
    t.holders = {}; r.renewed = now
    tidy(r); tidy_permits(r)
    put(r, KEYS[1])
    redis.call('PUBLISH', KEYS[1], 'force-released')
  end
elseif str(r.token) ~= nil then
  put(freed(r), KEYS[1])
  redis.call('PUBLISH', KEYS[1], 'force-released')
end
return raw
