-- nack.lua: settle a running row in the state nack_state() chose, fenced on its claim.
--
-- KEYS[1]  <base>j:<id>  the row
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag): <base>live,
--                        <base>q:<queue>:{r,s,l,f} (ready/delayed, suspended, running, finished
--                        counts), <base>wake (channel), <base>fin:<state> (settled rows by
--                        settle time, for retention.lua), <base>x:<queue>:<state> (the
--                        listing index, moved with the state), <base>cn, <base>cz:1m:<name>,
--                        <base>cb:1m:<start ms>:<name> (the outcome counters, see counters.lua)
-- ARGV[2]  worker        the fence's worker id
-- ARGV[3]  claim         the fence's claim ordinal
-- ARGV[4]  state         the target: ready, delayed, suspended, failed or dead
-- ARGV[5]  count         "1" to spend the attempt (never for suspended)
-- ARGV[6]  delay_ms      ready/delayed/suspended rows are due at now plus this (>= 0)
-- ARGV[7]  has_error     "1" to store the next three as the row's last error
-- ARGV[8…10] error message, code, stack (optional: "" for None, else "=" and the text)
-- Reply:   1 when settled; 0, changing nothing, when the row is not running under the fence.
--
-- A queued target is due at now + delay_ms (its queue is published on <base>wake when that is
-- now); a finished one frees the live key and is counted. The job's current 1-minute counter
-- bucket gains "failed" or "dead", or "retried" for a spent attempt settled ready or delayed.

local jk = KEYS[1]
local base = ARGV[1]
local row = redis.call('HMGET', jk, 'state', 'by', 'claim', 'queue', 'm', 'lk', 'id',
  'created', 'pri', 'name')
if row[1] ~= 'running' or row[2] ~= '=' .. ARGV[2] or row[3] ~= ARGV[3] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)
local state = ARGV[4]
local qk = base .. 'q:' .. row[4]
local m = row[5]
if ARGV[5] == '1' and state ~= 'suspended' then redis.call('HINCRBY', jk, 'att', 1) end
local outcome = nil
if state == 'failed' or state == 'dead' then
  outcome = state
elseif ARGV[5] == '1' and state ~= 'suspended' then
  outcome = 'retried'
end
if outcome then
  -- The 1-minute bucket holding now (ms, aligned on the epoch); counters.lua reads the layout.
  local minute = string.format('%.0f', math.floor(now / 60000000) * 60000)
  redis.call('HINCRBY', base .. 'cb:1m:' .. minute .. ':' .. row[10], outcome, 1)
  -- A name whose index already held this minute is in <base>cn already.
  if redis.call('ZADD', base .. 'cz:1m:' .. row[10], minute, minute) == 1 then
    redis.call('SADD', base .. 'cn', row[10])
  end
end
if ARGV[7] == '1' then
  redis.call('HSET', jk, 'err', ARGV[8], 'errc', ARGV[9], 'errs', ARGV[10])
end
redis.call('ZREM', qk .. ':l', m)
local xm = row[8] .. ':' .. row[7]
redis.call('ZREM', base .. 'x:' .. row[4] .. ':running', xm)
redis.call('ZADD', base .. 'x:' .. row[4] .. ':' .. state, 0, xm)
if state == 'ready' or state == 'delayed' or state == 'suspended' then
  local delay = tonumber(ARGV[6]) * 1000
  local run_at_s = string.format('%.0f', now + delay)
  redis.call('HSET', jk, 'state', state, 'run_at', run_at_s, 'vis', '', 'updated', now_s)
  if state == 'suspended' then
    redis.call('ZADD', qk .. ':s', run_at_s, m)
  else
    -- Rows of a non-zero priority wait in their priority's set (see claim.lua).
    local pri = row[9]
    if pri and pri ~= '' and pri ~= '0' then
      redis.call('ZADD', qk .. ':rp', pri, pri)
      redis.call('ZADD', qk .. ':r' .. pri, run_at_s, m)
    else
      redis.call('ZADD', qk .. ':r', run_at_s, m)
    end
  end
  if delay <= 0 then redis.call('PUBLISH', base .. 'wake', row[4]) end
else
  redis.call('HSET', jk, 'state', state, 'updated', now_s)
  redis.call('HINCRBY', qk .. ':f', state, 1)
  redis.call('ZADD', base .. 'fin:' .. state, now_s, row[7])
  if redis.call('HGET', base .. 'live', row[6]) == row[7] then
    redis.call('HDEL', base .. 'live', row[6])
  end
end
return 1
