-- ack.lua: settle running rows "done", each fenced on its own claim (one call for many acks).
--
-- KEYS[1]  <base>seq     routes the call (every key shares its hash tag)
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag): <base>j:<id> (row),
--                        <base>live, <base>q:<queue>:l (running rows), <base>q:<queue>:f
--                        (finished counts), <base>s:<run_id> (the run's steps),
--                        <base>fin:done (settled rows by settle time, for retention.lua),
--                        <base>x:<queue>:<state> (the listing index, moved with the state),
--                        <base>cn, <base>cz:1m:<name>, <base>cb:1m:<start ms>:<name> (the
--                        outcome counters, see counters.lua)
-- ARGV[2]  done_ttl_ms   the rows and their steps expire this long after the ack; 0 keeps them
-- ARGV[3]  n             how many acks follow
-- ARGV[4…] 5 values per ack: job id, the fence's worker id, the fence's claim ordinal, the
--          body's result as JSON text, and the attempt's duration in ms ("" for none)
-- Reply:   one value per ack, in order: 1 when settled; 0, changing nothing, when the row is not
--          running under that fence.
--
-- Acks apply in order, as if sent one by one: the attempt is counted and the live key freed. Each
-- done row joins <base>fin:done; with a TTL the members older than it (their rows expired) are
-- trimmed once per call, so the set never outgrows the done rows still kept. Likewise the oldest
-- members of each touched queue's done index whose rows expired are dropped (at most 10 per
-- queue per call; a listing drops any other it meets). The settled rows add "done" and their
-- durations to their job's current 1-minute counter bucket, once per job name per call.

local base = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)
local fin = base .. 'fin:done'
local live = base .. 'live'
local reply = {}
local touched = {}
-- Job name -> { settled rows, summed duration ms } for the counters.
local counted = {}

for i = 0, n - 1 do
  local o = 4 + i * 5
  local jk = base .. 'j:' .. ARGV[o]
  local row = redis.call('HMGET', jk, 'state', 'by', 'claim', 'queue', 'm', 'lk', 'id', 'run',
    'created', 'name')
  if row[1] ~= 'running' or row[2] ~= '=' .. ARGV[o + 1] or row[3] ~= ARGV[o + 2] then
    reply[#reply + 1] = 0
  else
    local qk = base .. 'q:' .. row[4]
    redis.call('HINCRBY', jk, 'att', 1)
    redis.call('HSET', jk, 'state', 'done', 'result', ARGV[o + 3], 'updated', now_s)
    redis.call('ZREM', qk .. ':l', row[5])
    redis.call('HINCRBY', qk .. ':f', 'done', 1)
    if redis.call('HGET', live, row[6]) == row[7] then
      redis.call('HDEL', live, row[6])
    end
    if ttl > 0 then
      redis.call('PEXPIRE', jk, ttl)
      redis.call('PEXPIRE', base .. 's:' .. row[8], ttl)
    end
    redis.call('ZADD', fin, now_s, row[7])
    local xm = row[9] .. ':' .. row[7]
    redis.call('ZREM', base .. 'x:' .. row[4] .. ':running', xm)
    redis.call('ZADD', base .. 'x:' .. row[4] .. ':done', 0, xm)
    touched[row[4]] = true
    local c = counted[row[10]]
    if c == nil then
      c = { 0, 0 }
      counted[row[10]] = c
    end
    c[1] = c[1] + 1
    c[2] = c[2] + (tonumber(ARGV[o + 4]) or 0)
    reply[#reply + 1] = 1
  end
end
-- The 1-minute bucket holding now (ms, aligned on the epoch); counters.lua reads the layout.
local minute = string.format('%.0f', math.floor(now / 60000000) * 60000)
for name, c in pairs(counted) do
  local ck = base .. 'cb:1m:' .. minute .. ':' .. name
  redis.call('HINCRBY', ck, 'done', c[1])
  if c[2] ~= 0 then redis.call('HINCRBYFLOAT', ck, 'dur', string.format('%.17g', c[2])) end
  -- A name whose index already held this minute is in <base>cn already.
  if redis.call('ZADD', base .. 'cz:1m:' .. name, minute, minute) == 1 then
    redis.call('SADD', base .. 'cn', name)
  end
end
if ttl > 0 then
  for queue in pairs(touched) do
    local xk = base .. 'x:' .. queue .. ':done'
    for _, xm in ipairs(redis.call('ZRANGE', xk, 0, 9)) do
      if redis.call('EXISTS', base .. 'j:' .. string.sub(xm, 18)) == 1 then break end
      redis.call('ZREM', xk, xm)
    end
  end
  redis.call('ZREMRANGEBYSCORE', fin, '-inf', '(' .. string.format('%.0f', now - ttl * 1000))
end
return reply
