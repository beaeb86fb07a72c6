-- retention.lua: delete rows of one finished state settled before a cutoff, with their steps.
--
-- KEYS[1]  <base>fin:<state>  the state's settled rows: member the job id, score the settle time
--                             (µs since the epoch), written by ack.lua, nack.lua and cancel.lua
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag): <base>j:<id> (row),
--                        <base>s:<run_id> (its run's steps), <base>x:<queue>:<state> (the
--                        listing index, which loses the row too)
-- ARGV[2]  state         the finished state (done, failed, dead or cancelled)
-- ARGV[3]  before_us     only rows settled strictly before this instant (µs since the epoch)
-- ARGV[4]  limit         the most rows deleted by this call
-- Reply:   how many rows were deleted.
--
-- A member whose row is gone (a done row's TTL lapsed) or no longer in this state is dropped from
-- the set without being counted; at most 10 x limit members are looked at per call, so one call
-- stays short whatever the set holds.

local fin = KEYS[1]
local base = ARGV[1]
local state = ARGV[2]
local before = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local deleted = 0
local seen = 0
while deleted < limit and seen < limit * 10 do
  local ids = redis.call('ZRANGEBYSCORE', fin, '-inf', '(' .. ARGV[3], 'LIMIT', 0, limit - deleted)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    seen = seen + 1
    local jk = base .. 'j:' .. id
    local row = redis.call('HMGET', jk, 'state', 'run', 'updated', 'queue', 'created')
    if row[1] == state and tonumber(row[3]) < before then
      redis.call('DEL', jk, base .. 's:' .. row[2])
      redis.call('ZREM', base .. 'x:' .. row[4] .. ':' .. state, row[5] .. ':' .. id)
      deleted = deleted + 1
    end
    redis.call('ZREM', fin, id)
  end
end
return deleted
