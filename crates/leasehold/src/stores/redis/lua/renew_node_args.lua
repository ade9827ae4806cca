#!lua flags=allow-cross-slot-keys
local n = tonumber(ARGV[1])
local keys, args = {}, {}
for i = 1, n do keys[i] = ARGV[i + 1] end
for i = n + 2, #ARGV do args[#args + 1] = ARGV[i] end
