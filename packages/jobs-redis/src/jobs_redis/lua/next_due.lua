-- next_due.lua: how long until a row of the named queues becomes claimable (an idle worker's timer).
--
-- KEYS[1]  <base>seq     routes the call (every key shares its tag; not read)
-- ARGV[1]  base          "{<prefix>}:"; reads <base>paused and each queue's <base>q:<queue>:r
--                        (ready/delayed by run_at), <base>q:<queue>:s (suspended by run_at) and
--                        <base>q:<queue>:l (running by lease expiry)
-- ARGV[2…] the queue names
-- Reply:   milliseconds until the first such run_at or lease expiry (rounded up, 0 when one is
--          due already), as text, or false when no row waits. Paused queues are left out. A lease
--          expiry counts because claim.lua takes a lapsed row: an idle worker wakes when a dead
--          worker's lease lapses rather than at its next poll.

local base = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local first = nil
for i = 2, #ARGV do
  local queue = ARGV[i]
  if redis.call('SISMEMBER', base .. 'paused', queue) == 0 then
    -- Every priority's ready/delayed set (see claim.lua), the suspended one and the running one.
    local kinds = { ':r', ':s', ':l' }
    for _, p in ipairs(redis.call('ZRANGE', base .. 'q:' .. queue .. ':rp', 0, -1)) do
      kinds[#kinds + 1] = ':r' .. p
    end
    for _, kind in ipairs(kinds) do
      local top = redis.call('ZRANGE', base .. 'q:' .. queue .. kind, 0, 0, 'WITHSCORES')
      if top[2] then
        local at = tonumber(top[2])
        if first == nil or at < first then first = at end
      end
    end
  end
end
if first == nil then return false end
return string.format('%.0f', math.max(0, math.ceil((first - now) / 1000)))
