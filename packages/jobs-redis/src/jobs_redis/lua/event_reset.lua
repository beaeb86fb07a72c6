-- event_reset.lua: delete every event of the prefix, expired or not (the test seam).
--
-- KEYS[1]  <base>evx    every event by expires_at, members "<seq>:<id>"
-- ARGV[1]  base         "{<prefix>}:"; <base>ev:<id> and <base>evn:<name> are built from it
-- Reply:   how many events were deleted.
--
-- Waiting steps and their index are untouched: they match only events published afterwards.

local base = ARGV[1]
local all = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, member in ipairs(all) do
  local ek = base .. 'ev:' .. string.sub(member, 18)
  redis.call('DEL', base .. 'evn:' .. redis.call('HGET', ek, 'name'), ek)
end
redis.call('DEL', KEYS[1])
return #all
