-- claim.lua: lease due rows of some queues to one worker; bury lapsed rows on their last attempt.
--
-- KEYS[1]  <base>seq     routes the call (every key shares its hash tag)
-- ARGV[1]  base          "{<prefix>}:"; keys built from it: <base>paused, <base>live,
--                        <base>j:<id> (row), <base>q:<queue>:r (ready/delayed by run_at),
--                        <base>q:<queue>:s (suspended by run_at), <base>q:<queue>:l (running by
--                        lease expiry), <base>q:<queue>:f (finished counts),
--                        <base>x:<queue>:<state> (the listing index, moved with the state),
--                        <base>cn, <base>cz:1m:<name>, <base>cb:1m:<start ms>:<name> (the
--                        outcome counters, see counters.lua)
-- ARGV[2]  limit         the most rows to hand out (>= 1)
-- ARGV[3]  vt_ms         the lease each claimed row gets, in milliseconds
-- ARGV[4]  worker        the claimant's incarnation id
-- ARGV[5]  nq            how many queue names follow (distinct)
-- ARGV[6…] the queues, then nd, then nd job names whose buried rows settle "failed"
-- Reply:   { claimed, buried }: claimed holds 15 values per row (id, run_id, name, queue, input,
--          attempts spent, max_attempts, claim, tenant, key, traceparent, enqueued_by,
--          created µs, parent run (optional, "" for none), and the run's steps as step_load.lua
--          answers them); buried holds 5 per row (id, name, queue, state, parent run).
--
-- Candidates are rows of unpaused queues whose run_at passed (ready, delayed, suspended) and
-- running rows whose lease expiry passed (at most 1,000 of those per queue per call), taken
-- lowest priority first, then oldest (run_at, sequence), across the queues. Ready and delayed rows
-- of priority p wait in <base>q:<queue>:r<p> ("" for 0; the non-zero priorities present are
-- listed in <base>q:<queue>:rp): they are read lowest priority first until `limit` are found, and
-- a priority whose set emptied leaves the list. A debounced row (field "db") frees its live key
-- at its first claim, so the next enqueue of its key makes a new row. A lapsed row's attempt is counted; when that
-- spends its last one it is buried ("dead" with LEASE_LAPSED_FINAL_ATTEMPT, or "failed" for names
-- in the drop list), frees its live key, adds "dead" or "failed" to its job's current 1-minute
-- counter bucket and does not count against the limit. Each claimed row
-- carries its run's steps, so the attempt that loads them next needs no round trip of its own.

local base = ARGV[1]
local limit = tonumber(ARGV[2])
local vt = tonumber(ARGV[3])
local worker = ARGV[4]
local nq = tonumber(ARGV[5])
local nd = tonumber(ARGV[6 + nq])
local drop = {}
for i = 1, nd do drop[ARGV[6 + nq + i]] = true end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)
local until_s = string.format('%.0f', now + vt * 1000)
-- The 1-minute bucket holding now (ms, aligned on the epoch); counters.lua reads the layout.
local minute = string.format('%.0f', math.floor(now / 60000000) * 60000)

local cands = {}
for i = 1, nq do
  local queue = ARGV[5 + i]
  if redis.call('SISMEMBER', base .. 'paused', queue) == 0 then
    local qk = base .. 'q:' .. queue
    local pris = { 0 }
    for _, p in ipairs(redis.call('ZRANGE', qk .. ':rp', 0, -1)) do
      pris[#pris + 1] = tonumber(p)
    end
    table.sort(pris)
    local found = 0
    for _, p in ipairs(pris) do
      if found >= limit then break end
      local src = 'r'
      if p ~= 0 then src = 'r' .. p end
      local got = redis.call('ZRANGEBYSCORE', qk .. ':' .. src, '-inf', now_s, 'WITHSCORES',
        'LIMIT', 0, limit - found)
      for j = 1, #got, 2 do
        cands[#cands + 1] = { p, tonumber(got[j + 1]), got[j], queue, src }
      end
      found = found + #got / 2
      if p ~= 0 and #got == 0 and redis.call('ZCARD', qk .. ':' .. src) == 0 then
        redis.call('ZREM', qk .. ':rp', tostring(p))
      end
    end
    local got = redis.call('ZRANGEBYSCORE', qk .. ':s', '-inf', now_s, 'WITHSCORES',
      'LIMIT', 0, limit)
    for j = 1, #got, 2 do
      local pri = redis.call('HGET', base .. 'j:' .. string.sub(got[j], 18), 'pri')
      cands[#cands + 1] = { tonumber(pri) or 0, tonumber(got[j + 1]), got[j], queue, 's' }
    end
    local lapsed = redis.call('ZRANGEBYSCORE', qk .. ':l', '-inf', now_s, 'LIMIT', 0, 1000)
    for _, m in ipairs(lapsed) do
      local row = redis.call('HMGET', base .. 'j:' .. string.sub(m, 18), 'run_at', 'pri')
      cands[#cands + 1] = { tonumber(row[2]) or 0, tonumber(row[1]), m, queue, 'l' }
    end
  end
end

table.sort(cands, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[3] < b[3]
end)

local claimed, buried, taken = {}, {}, 0
for _, c in ipairs(cands) do
  if taken >= limit then break end
  local m, queue, src = c[3], c[4], c[5]
  local id = string.sub(m, 18)
  local jk = base .. 'j:' .. id
  local qk = base .. 'q:' .. queue
  local bury = false
  local was = redis.call('HMGET', jk, 'state', 'created')
  local xm = was[2] .. ':' .. id
  if src == 'l' then
    local att = redis.call('HINCRBY', jk, 'att', 1)
    bury = att >= tonumber(redis.call('HGET', jk, 'max'))
  end
  redis.call('ZREM', qk .. ':' .. src, m)
  if bury then
    local name = redis.call('HGET', jk, 'name')
    local state = 'dead'
    if drop[name] then state = 'failed' end
    redis.call('HSET', jk, 'state', state, 'updated', now_s,
      'err', '=LEASE_LAPSED_FINAL_ATTEMPT', 'errc', '=X_JOB_MAX_ATTEMPTS', 'errs', '')
    redis.call('HINCRBY', qk .. ':f', state, 1)
    redis.call('HINCRBY', base .. 'cb:1m:' .. minute .. ':' .. name, state, 1)
    -- A name whose index already held this minute is in <base>cn already.
    if redis.call('ZADD', base .. 'cz:1m:' .. name, minute, minute) == 1 then
      redis.call('SADD', base .. 'cn', name)
    end
    redis.call('ZREM', base .. 'x:' .. queue .. ':' .. was[1], xm)
    redis.call('ZADD', base .. 'x:' .. queue .. ':' .. state, 0, xm)
    local lk = redis.call('HGET', jk, 'lk')
    if redis.call('HGET', base .. 'live', lk) == id then redis.call('HDEL', base .. 'live', lk) end
    buried[#buried + 1] = id
    buried[#buried + 1] = name
    buried[#buried + 1] = queue
    buried[#buried + 1] = state
    buried[#buried + 1] = redis.call('HGET', jk, 'par') or ''
  else
    local claim = redis.call('HINCRBY', jk, 'claim', 1)
    if claim == 1 and redis.call('HGET', jk, 'db') == '1' then
      local lk = redis.call('HGET', jk, 'lk')
      if redis.call('HGET', base .. 'live', lk) == id then redis.call('HDEL', base .. 'live', lk) end
    end
    redis.call('HSET', jk, 'state', 'running', 'by', '=' .. worker, 'vis', until_s,
      'updated', now_s)
    redis.call('ZADD', qk .. ':l', until_s, m)
    if was[1] ~= 'running' then
      redis.call('ZREM', base .. 'x:' .. queue .. ':' .. was[1], xm)
      redis.call('ZADD', base .. 'x:' .. queue .. ':running', 0, xm)
    end
    local row = redis.call('HMGET', jk, 'id', 'run', 'name', 'queue', 'input', 'att', 'max',
      'claim', 'tenant', 'key', 'tp', 'eb', 'created', 'par')
    for i = 1, 14 do claimed[#claimed + 1] = row[i] or '' end
    local steps = {}
    local all = redis.call('HGETALL', base .. 's:' .. row[2])
    for i = 1, #all, 2 do
      local kind = string.sub(all[i], 1, 2)
      if kind == 'r:' or kind == 'q:' then
        steps[#steps + 1] = all[i]
        steps[#steps + 1] = all[i + 1]
      end
    end
    claimed[#claimed + 1] = steps
    taken = taken + 1
  end
end
return { claimed, buried }
