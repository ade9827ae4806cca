local r = decode(redis.pcall('GET', KEYS[1]))
if type(r) ~= 'table' then return 0 end
local at = place(r, ARGV[1])
if at == nil then return 0 end
if at == 0 then clear_waiter(r) else table.remove(r.queue, at) end
tidy(r)
put(r, KEYS[1])
-- The first in line changed: the next one may take a free lease now.
if at == 0 then redis.call('PUBLISH', KEYS[1], 'withdrawn') end
return 1
