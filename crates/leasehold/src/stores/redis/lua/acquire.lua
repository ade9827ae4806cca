-- The caller's holder and token, from the record it sent (its head is JSON once closed).
local me = cjson.decode(ARGV[1] .. '0}')
local token = me.token
local r = decode(raw)
if r == 'corrupt' then return foreign(KEYS[1], raw) end
if type(r) == 'table' then
  local mine = str(r.waiter_token) == token
  if held(r) or (live_waiter(r) and not mine) then
    local wttl = tonumber(ARGV[5])
    if wttl > 0 and (mine or not live_waiter(r)) then
      local fresh = mine and live_waiter(r) and num(r.waiter_expires) >= now + math.floor(wttl * 2 / 3)
      if not fresh then
        r.waiter = me.holder; r.waiter_token = token; r.waiter_expires = now + wttl
        raw = put(r, KEYS[1])
      end
    elseif ARGV[6] == '1' and r.watched ~= true then
      r.watched = true
      raw = put(r, KEYS[1])
    end
    return {0, raw}
  end
end
local fence = redis.call('INCRBY', KEYS[2], ARGV[4])
local ttl = tonumber(ARGV[3])
local g = cjson.decode(ARGV[1] .. string.format('%d', fence) .. ',"acquired":' .. now
  .. ',"renewed":' .. now .. ',"expires":' .. (now + ttl) .. ARGV[2])
if type(r) == 'table' and live_waiter(r) and str(r.waiter_token) ~= token then
  g.waiter = r.waiter; g.waiter_token = r.waiter_token; g.waiter_expires = r.waiter_expires
end
-- Contenders that marked the record still wait: our release must publish for them.
if type(r) == 'table' and r.watched == true then g.watched = true end
return {1, put(g, KEYS[1])}
