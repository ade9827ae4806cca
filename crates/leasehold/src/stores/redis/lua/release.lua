local r = decode(raw)
if type(r) == 'table' and permits(r) ~= nil then
  -- A permit: it alone is freed, the other holders keep theirs.
  local t, mine = permits(r), nil
  for i, h in ipairs(holders(t)) do if type(h) == 'table' and h.token == ARGV[1] then mine = i end end
  if mine == nil then return 0 end
  local was_held = num(t.holders[mine].expires) > now
  table.remove(t.holders, mine)
  tidy(r); tidy_permits(r)
  r.renewed = now
  put(r, KEYS[1])
  -- A permit came free: the waiters wake, when there are any (in line, or subscribed and
  -- marked `watched`).
  if str(r.waiter_token) ~= nil or r.watched == true then
    redis.call('PUBLISH', KEYS[1], 'released')
  end
  if was_held then return 1 end
  return 2
end
if type(r) ~= 'table' or str(r.token) ~= ARGV[1] then return 0 end
local was_held = held(r)
freed(r)
local granted = nil
if ARGV[3] == '1' then granted = grant_first(r, KEYS[2]) end
put(r, KEYS[1])
publish_release(KEYS[1], granted)
if was_held then return 1 end
return 2
