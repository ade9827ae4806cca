local r = decode(raw)
if type(r) ~= 'table' or str(r.token) ~= ARGV[1] then return 0 end
local was_held = held(r)
put(freed(r), KEYS[1])
redis.call('PUBLISH', KEYS[1], 'released')
if was_held then return 1 end
return 2
