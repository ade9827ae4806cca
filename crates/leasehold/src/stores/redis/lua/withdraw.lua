local r = decode(redis.pcall('GET', KEYS[1]))
if type(r) ~= 'table' or str(r.waiter_token) ~= ARGV[1] then return 0 end
clear_waiter(r)
put(r, KEYS[1])
redis.call('PUBLISH', KEYS[1], 'withdrawn')
return 1
