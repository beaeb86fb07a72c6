-- time.lua: the server's clock, the one clock sleeps, waits and events are measured on.
--
-- KEYS[1]  <base>seq  routes the call to the prefix's node (not read)
-- Reply:   the server's now in microseconds since the epoch, as text.

local t = redis.call('TIME')
return string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
