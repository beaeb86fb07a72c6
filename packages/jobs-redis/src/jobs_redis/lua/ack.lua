-- ack.lua: settle a running row "done", fenced on its claim.
--
-- KEYS[1]  <base>j:<id>  the row
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag): <base>live,
--                        <base>q:<queue>:l (running rows), <base>q:<queue>:f (finished counts),
--                        <base>s:<run_id> (the run's steps)
-- ARGV[2]  worker        the fence's worker id
-- ARGV[3]  claim         the fence's claim ordinal
-- ARGV[4]  result        the body's result, JSON text
-- ARGV[5]  done_ttl_ms   the row and its steps expire this long after the ack; 0 keeps them
-- Reply:   1 when settled; 0, changing nothing, when the row is not running under the fence.
--
-- The attempt is counted and the live key freed.

local jk = KEYS[1]
local base = ARGV[1]
local row = redis.call('HMGET', jk, 'state', 'by', 'claim', 'queue', 'm', 'lk', 'id', 'run')
if row[1] ~= 'running' or row[2] ~= '=' .. ARGV[2] or row[3] ~= ARGV[3] then return 0 end
local t = redis.call('TIME')
local now_s = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local qk = base .. 'q:' .. row[4]
redis.call('HINCRBY', jk, 'att', 1)
redis.call('HSET', jk, 'state', 'done', 'result', ARGV[4], 'updated', now_s)
redis.call('ZREM', qk .. ':l', row[5])
redis.call('HINCRBY', qk .. ':f', 'done', 1)
if redis.call('HGET', base .. 'live', row[6]) == row[7] then
  redis.call('HDEL', base .. 'live', row[6])
end
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call('PEXPIRE', jk, ttl)
  redis.call('PEXPIRE', base .. 's:' .. row[8], ttl)
end
return 1
