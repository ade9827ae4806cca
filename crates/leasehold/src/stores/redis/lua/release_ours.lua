local raw = redis.pcall('GET', KEYS[1])
if not raw then return 0 end
-- Ours, nobody waits, and not a permit record (whose holders' tokens it also holds).
if type(raw) == 'string' and string.find(raw, '"token":' .. ARGV[2], 1, true) and string.find(raw, '"waiter_token":null', 1, true)
    and not string.find(raw, '"permits":', 1, true) then
  redis.call('DEL', KEYS[1])
  if string.find(raw, '"watched":true', 1, true) then
    redis.call('PUBLISH', KEYS[1], 'released')
  end
  return 1
end
