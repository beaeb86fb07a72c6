-- lease_release.lua: free a holder's slot (nothing happens if it holds none).
--
-- KEYS[1]  <base>ls:<key>  holders in slot order
-- KEYS[2]  <base>lx:<key>  holder -> expiry (µs)
-- ARGV[1]  holder
-- Reply:   1 when a slot was freed, else 0.

redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
