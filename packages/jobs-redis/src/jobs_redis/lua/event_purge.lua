-- event_purge.lua: delete every event whose expiry has passed.
--
-- KEYS[1]  <base>evx    every event by expires_at (µs), members "<seq>:<id>"
-- ARGV[1]  base         "{<prefix>}:"; keys built from it (same hash tag): <base>ev:<id>,
--                       <base>evn:<name>
-- Reply:   how many events were deleted.

local base = ARGV[1]
local t = redis.call('TIME')
local now_s = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_s)
for _, member in ipairs(gone) do
  local ek = base .. 'ev:' .. string.sub(member, 18)
  local name = redis.call('HGET', ek, 'name')
  redis.call('ZREM', base .. 'evn:' .. name, member)
  redis.call('DEL', ek)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_s)
return #gone
