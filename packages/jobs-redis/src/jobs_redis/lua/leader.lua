-- leader.lua: the scheduler's leader lease, one holder at a time, expiring on the server's clock.
--
-- KEYS[1]  <base>leader  a string holding the holder's id, with a Redis expiry (PX)
-- ARGV[1]  mode          "acquire" (ARGV[2] holder, ARGV[3] ttl_ms), "release" (ARGV[2]
--                        holder) or "holder"
-- Reply:   acquire: 1 when the holder holds it now (taken free or lapsed, or renewed), 0 when
--          another holder's lease is unexpired. release: 1. holder: the holder or false.

local mode = ARGV[1]
local held = redis.call('GET', KEYS[1])
if mode == 'acquire' then
  if held and held ~= ARGV[2] then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
elseif mode == 'release' then
  if held == ARGV[2] then redis.call('DEL', KEYS[1]) end
  return 1
end
return held
