-- `pcall`: a value of another type (an operator's hash) is an error table, read as corrupt.
local raw = redis.pcall('GET', KEYS[1])
if not raw then
  local ns = server_ms()
  -- Each number formatted once, as an integer: Lua formats a number on every concatenation, with
  -- the floating-point '%.14g' (several times slower than '%d', and an exponent from 1e14 up);
  -- the TTL goes to PX as the string sent, not a number Redis would format again.
  local fence = string.format('%d', redis.call('INCRBY', KEYS[2], ARGV[4]))
  redis.call('SET', KEYS[1], ARGV[1] .. fence .. ',"acquired":' .. ns .. ',"renewed":' .. ns
    .. ',"expires":' .. string.format('%d', ns + ARGV[3]) .. ARGV[2], 'PX', ARGV[3])
  -- A string, not a table: the cheapest reply to build.
  return fence .. ' ' .. ns
end
