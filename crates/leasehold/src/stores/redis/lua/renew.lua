local out = {}
for i, k in ipairs(keys) do
  local token = args[3 * i - 2]
  local ttl = tonumber(args[3 * i - 1])
  -- `pcall`: a value of another type is read as corrupt, and a key of a slot this node does not
  -- serve (only possible for undeclared keys) is left to a call naming it.
  local raw = redis.pcall('GET', k)
  local a, b, c = 0, 'released', ''
  if type(raw) == 'table' and not string.find(tostring(raw.err), 'WRONGTYPE', 1, true) then
    b = 'elsewhere'; c = tostring(raw.err)
  elseif type(raw) == 'string' and string.find(raw, '"waiter_token":null', 1, true)
      and string.find(raw, '"token":' .. args[3 * i], 1, true)
      and not string.find(raw, '"permits":', 1, true) then
    -- Ours, nobody waits, and a lock (not a permit record, whose holders' tokens and times it
    -- also holds): rewrite the times without decoding.
    if (tonumber(string.match(raw, '"expires":(%d+)')) or 0) > now then
      -- Integers formatted as such (see the acquire script), the TTL passed on as sent.
      raw = string.gsub(raw, '"renewed":%d+', '"renewed":' .. string.format('%d', now), 1)
      raw = string.gsub(raw, '"expires":%d+', '"expires":' .. string.format('%d', now + ttl), 1)
      raw = string.gsub(raw, '"ttl_ms":%d+', '"ttl_ms":' .. args[3 * i - 1], 1)
      redis.call('SET', k, raw, 'PX', args[3 * i - 1])
      a = 1; b = raw
    else
      b = 'expired'
    end
  else
    local r = decode(raw)
    if r == 'corrupt' then
      b = 'taken'; c = 'an overwritten (unreadable) record'
    elseif r ~= nil and permits(r) ~= nil then
      -- A permit: renewed on its own (the other holders' are left as they are); gone when the
      -- table no longer lists it (released, force-released), expired by the server's clock.
      local mine = nil
      for _, h in ipairs(holders(permits(r))) do
        if type(h) == 'table' and h.token == token then mine = h end
      end
      if mine ~= nil and num(mine.expires) <= now then
        b = 'expired'
      elseif mine ~= nil then
        tidy(r); tidy_permits(r)
        mine.renewed = now; mine.expires = now + ttl; mine.ttl_ms = ttl
        a = 1; b = put(r, k)
      end
    elseif r ~= nil and str(r.token) ~= nil then
      if str(r.token) ~= token then
        b = 'taken'; c = tostring(str(r.holder) or '')
      elseif num(r.expires) <= now then
        b = 'expired'
      else
        r.renewed = now; r.expires = now + ttl; r.ttl_ms = ttl
        tidy(r)
        a = 1; b = put(r, k)
      end
    end
  end
  out[#out + 1] = a; out[#out + 1] = b; out[#out + 1] = c
end
return out
