-- lease_holders.lua: the holders of a key's unexpired slots, in slot order.
--
-- KEYS[1]  <base>ls:<key>  holders in slot order
-- KEYS[2]  <base>lx:<key>  holder -> expiry (µs)
-- Reply:   the holders.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for _, h in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local exp = redis.call('HGET', KEYS[2], h)
  if exp and tonumber(exp) > now then out[#out + 1] = h end
end
return out
