local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' then return false end
local r = decode(raw)
if type(r) ~= 'table' then return raw or false end
if str(r.token) ~= nil then
  put(freed(r), KEYS[1])
  redis.call('PUBLISH', KEYS[1], 'force-released')
end
return raw
