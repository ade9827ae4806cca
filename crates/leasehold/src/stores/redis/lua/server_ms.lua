local server_ms_read
local function server_ms()
  if not server_ms_read then
    local t = redis.call('TIME')
    local us = t[2]
    if #us > 3 then server_ms_read = t[1] .. string.rep('0', 6 - #us) .. string.sub(us, 1, -4) else server_ms_read = t[1] .. '000' end
  end
  return server_ms_read
end
