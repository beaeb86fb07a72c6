-- lease_renew.lua: extend a holder's unexpired slot.
--
-- KEYS[1]  <base>ls:<key>  holders in slot order
-- KEYS[2]  <base>lx:<key>  holder -> expiry (µs)
-- ARGV[1]  holder          whose slot to extend
-- ARGV[2]  ttl_ms          the slot now expires this long after now (>= 1)
-- Reply:   1 when renewed; 0 when the holder holds no unexpired slot.

local holder, ttl = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local exp = redis.call('HGET', KEYS[2], holder)
if not exp or tonumber(exp) <= now then return 0 end
redis.call('HSET', KEYS[2], holder, string.format('%.0f', now + ttl * 1000))
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
