local raw = redis.pcall('GET', KEYS[1])
if type(raw) ~= 'string' then if ARGV[1] == '' then return 1 end return 0 end
-- The fence compared as written: exact at any size.
if ARGV[1] ~= '' and string.match(raw, '"fence":(%d+)') ~= ARGV[1] then return 0 end
if string.find(raw, '"watched":true', 1, true) then return 1 end
local r = decode(raw)
if type(r) ~= 'table' or not held(r) then return 1 end
if string.sub(raw, -1) == '}' then
  -- Added as text: the record stays byte for byte as it was, and so does the key's TTL.
  redis.call('SET', KEYS[1], string.sub(raw, 1, -2) .. ',"watched":true}', 'KEEPTTL')
else
  r.watched = true
  put(r, KEYS[1])
end
return 1
