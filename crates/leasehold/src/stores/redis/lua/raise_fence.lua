local c = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if c < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
