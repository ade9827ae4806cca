local r = decode(redis.pcall('GET', KEYS[1]))
if type(r) ~= 'table' then return 0 end
if r.unclaimed == true and str(r.token) == ARGV[1] then
  -- Granted by a release and not claimed: released, to the next in line.
  freed(r)
  local granted = grant_first(r, KEYS[2])
  put(r, KEYS[1])
  publish_release(KEYS[1], granted)
  return 1
end
local at = place(r, ARGV[1])
if at == nil then return 0 end
if at == 0 then clear_waiter(r) else table.remove(r.queue, at) end
-- (A waiting writer leaves `writers_waiting` with its place.)
tidy(r); tidy_permits(r)
put(r, KEYS[1])
-- The first in line changed: the next one may take a free lease now. On a semaphore or
-- read-write key any place counts: those behind it may now have room.
if at == 0 or permits(r) ~= nil then redis.call('PUBLISH', KEYS[1], 'withdrawn') end
return 1
