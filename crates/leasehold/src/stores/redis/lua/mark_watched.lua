local raw = redis.pcall('GET', KEYS[1])
if type(raw) ~= 'string' then if ARGV[1] == '' then return 1 end return 0 end
local r = nil
if string.find(raw, '"permits":', 1, true) then r = decode(raw) end
if type(r) == 'table' and permits(r) ~= nil then
  -- A semaphore or read-write key: its `fence` is the last one it issued; marked while a permit
  -- is held.
  if ARGV[1] ~= '' and string.format('%d', num(r.fence)) ~= ARGV[1] then return 0 end
  local live = false
  for _, h in ipairs(holders(permits(r))) do
    if type(h) == 'table' and num(h.expires) > now then live = true end
  end
  if r.watched == true or not live then return 1 end
else
  -- The fence compared as written: exact at any size.
  if ARGV[1] ~= '' and string.match(raw, '"fence":(%d+)') ~= ARGV[1] then return 0 end
  if string.find(raw, '"watched":true', 1, true) then return 1 end
  r = decode(raw)
  if type(r) ~= 'table' or not held(r) then return 1 end
end
if string.sub(raw, -1) == '}' then
  -- Added as text: the record stays byte for byte as it was, and so does the key's TTL.
  redis.call('SET', KEYS[1], string.sub(raw, 1, -2) .. ',"watched":true}', 'KEEPTTL')
else
  r.watched = true
  put(r, KEYS[1])
end
return 1
