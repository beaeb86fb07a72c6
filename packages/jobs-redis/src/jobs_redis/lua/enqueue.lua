-- enqueue.lua: queue rows unless their id or live key is taken (enqueue and enqueue_many).
--
-- KEYS[1]  <base>seq     the row sequence counter; it routes the call (every key shares its tag)
-- ARGV[1]  base          "{<prefix>}:"; every other key is built from it and so carries the same
--                        hash tag: <base>j:<id> (row), <base>live (live keys -> id),
--                        <base>queues (queue names), <base>q:<queue>:r (ready/delayed by run_at),
--                        <base>s:<run_id> (the run's steps; field "#job" names its job),
--                        <base>x:<queue>:<state> (the listing index: members "<created µs>:<id>")
-- ARGV[2]  n             how many rows follow
-- ARGV[3…] 17 values per row: id, run_id, name, queue, input (JSON text), idempotency key,
--          tenant (optional), max_attempts, run_at (µs since the epoch, "" for none), delay_ms,
--          traceparent (optional), enqueued_by (optional), live-key field, priority (an int,
--          lower claimed first), debounce_ms ("" for none), debounce_max_ms ("" for none) and
--          parent run id (optional: a child job's parent run; the row joins
--          <base>c:<parent run id>, the parent's children by insertion order).
--          An optional value is "" for None, else "=" followed by the text.
--          Then, for a cron fire only (SchedulerState.fire), 6 more: the task, the watermark the
--          fire expects (µs, "" for none), the watermark it leaves (µs), the occurrence (µs), and
--          the task's cron expression and time zone ("" when not told).
-- Reply:   3 values per row, in input order: id, run_id, 1 when deduped else 0; or, writing
--          nothing, { "run-id-taken", position (1-based), the holding job's id }; for a fire
--          whose expected watermark is not the stored one, writing nothing, { "moved" }.
--
-- A request whose id names a row (live or finished) answers it; else one whose live key is held
-- (by an earlier row of this call too) answers the holder; else a row is inserted. A debounced
-- request (debounce_ms set) inserts a row due now + debounce_ms (field "db" = "1": it holds its
-- live key only until its first claim, claim.lua frees it); one whose key a row holds that still
-- waits for its first claim (ready or delayed, claim 0) gives that row its input and priority and
-- makes it due now + debounce_ms, capped at its first enqueue + debounce_max_ms, never before now,
-- and answers it (deduped). Rows of priority p wait in <base>q:<queue>:r<p> ("" for 0), each
-- non-zero priority present listed in <base>q:<queue>:rp (scored by itself). Its run_at is
-- the request's (a past one is stored as the server's now) or now plus delay_ms; it is "delayed"
-- when run_at is in the future, else "ready". Each queue that received a ready row, or a delayed
-- row due before every other row of it due later than now, is published once on <base>wake.
-- A run id belongs to one job: an inserted row records its id in its run's
-- steps hash (<base>s:<run_id>, field "#job", which expires with the row's steps), and a request
-- that would insert a row under a run id another job recorded refuses the whole call.
--
-- A fire compares the task's watermark (<base>wm, task -> µs) before anything is written and, in
-- the same call as the inserts, moves it and records the fire (<base>fires, task -> JSON text:
-- occurrence, watermark, fired_at, job_ids), so no reader sees the rows without the watermark.

local base = ARGV[1]
local n = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)
local live = base .. 'live'
local reply = {}
local woken = {}
local fire_at = 3 + n * 17
local function rkey(qk, pri)
  if pri == nil or pri == '' or pri == '0' then return qk .. ':r' end
  redis.call('ZADD', qk .. ':rp', pri, pri)
  return qk .. ':r' .. pri
end
local function first_later(qk, after)
  local best = nil
  local keys = { qk .. ':r' }
  for _, p in ipairs(redis.call('ZRANGE', qk .. ':rp', 0, -1)) do keys[#keys + 1] = qk .. ':r' .. p end
  for _, k in ipairs(keys) do
    local nx = redis.call('ZRANGEBYSCORE', k, '(' .. after, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if nx[2] and (not best or tonumber(nx[2]) < best) then best = tonumber(nx[2]) end
  end
  return best
end
local task = ARGV[fire_at]
if task then
  local stored = redis.call('HGET', base .. 'wm', task) or ''
  if stored ~= ARGV[fire_at + 1] then return { 'moved' } end
end

-- First pass, writing nothing: who answers each request (the row its id names, the live row
-- holding its key, or an earlier request of this call with the key), and whether a request
-- that inserts brings a run id another job recorded (then the whole call is refused).
local held = {}
local held_run = {}
local batch_ids = {}
local batch_keys = {}
for i = 0, n - 1 do
  local o = 3 + i * 17
  local id, run_id, lk = ARGV[o], ARGV[o + 1], ARGV[o + 12]
  if batch_ids[id] then
    held[i] = id
    held_run[i] = batch_ids[id]
  elseif redis.call('EXISTS', base .. 'j:' .. id) == 1 then
    held[i] = id
  elseif batch_keys[lk] then
    held[i] = batch_keys[lk][1]
    held_run[i] = batch_keys[lk][2]
  else
    held[i] = redis.call('HGET', live, lk)
    if not held[i] then
      local owner = redis.call('HGET', base .. 's:' .. run_id, '#job')
      if owner and owner ~= id then
        return { 'run-id-taken', i + 1, owner }
      end
      batch_keys[lk] = { id, run_id }
      batch_ids[id] = run_id
    end
  end
end

for i = 0, n - 1 do
  local o = 3 + i * 17
  local id, run_id, name, queue = ARGV[o], ARGV[o + 1], ARGV[o + 2], ARGV[o + 3]
  local lk = ARGV[o + 12]
  local pri, debounce, dmax = ARGV[o + 13], ARGV[o + 14], ARGV[o + 15]
  local jk = base .. 'j:' .. id
  local hk = held[i] and base .. 'j:' .. held[i]
  if held[i] and debounce ~= '' and not held_run[i] and held[i] ~= id then
    local h = redis.call('HMGET', hk, 'state', 'claim', 'queue', 'm', 'created', 'pri')
    if (h[1] == 'ready' or h[1] == 'delayed') and h[2] == '0' then
      local qk = base .. 'q:' .. h[3]
      local run_at = now + tonumber(debounce) * 1000
      if dmax ~= '' then run_at = math.min(run_at, tonumber(h[5]) + tonumber(dmax) * 1000) end
      run_at = math.max(run_at, now)
      local state = 'ready'
      if run_at > now then state = 'delayed' end
      local first = first_later(qk, now_s)
      redis.call('ZREM', rkey(qk, h[6]), h[4])
      redis.call('ZADD', rkey(qk, pri), string.format('%.0f', run_at), h[4])
      if state ~= h[1] then
        local xm = h[5] .. ':' .. held[i]
        redis.call('ZREM', base .. 'x:' .. h[3] .. ':' .. h[1], xm)
        redis.call('ZADD', base .. 'x:' .. h[3] .. ':' .. state, 0, xm)
      end
      redis.call('HSET', hk, 'input', ARGV[o + 4], 'pri', pri, 'db', '1', 'state', state,
        'run_at', string.format('%.0f', run_at), 'updated', now_s)
      if state == 'ready' or not first or first > run_at then woken[h[3]] = true end
    end
  end
  if held[i] then
    reply[#reply + 1] = held[i]
    reply[#reply + 1] = held_run[i] or redis.call('HGET', base .. 'j:' .. held[i], 'run')
    reply[#reply + 1] = 1
  else
    local run_at
    if debounce ~= '' then
      run_at = now + tonumber(debounce) * 1000
    elseif ARGV[o + 8] ~= '' then
      run_at = math.max(tonumber(ARGV[o + 8]), now)
    else
      run_at = now + math.max(tonumber(ARGV[o + 9]), 0) * 1000
    end
    local state = 'ready'
    if run_at > now then state = 'delayed' end
    local seq = redis.call('INCR', KEYS[1])
    local m = string.format('%016d', seq) .. ':' .. id
    redis.call('HSET', jk,
      'id', id, 'run', run_id, 'name', name, 'queue', queue, 'input', ARGV[o + 4],
      'key', ARGV[o + 5], 'tenant', ARGV[o + 6], 'max', ARGV[o + 7], 'att', 0, 'claim', 0,
      'by', '', 'vis', '', 'run_at', string.format('%.0f', run_at), 'created', now_s,
      'updated', now_s, 'err', '', 'errc', '', 'errs', '', 'result', 'null',
      'tp', ARGV[o + 10], 'eb', ARGV[o + 11], 'state', state, 'm', m, 'lk', lk, 'pri', pri,
      'db', debounce ~= '' and '1' or '', 'par', ARGV[o + 16])
    if ARGV[o + 16] ~= '' then
      redis.call('ZADD', base .. 'c:' .. string.sub(ARGV[o + 16], 2), seq, id)
    end
    redis.call('HSET', live, lk, id)
    redis.call('HSET', base .. 's:' .. run_id, '#job', id)
    redis.call('SADD', base .. 'queues', queue)
    -- A row for later wakes its queue when it comes before every other row due later than
    -- now: an idle worker sleeps until the first due row it knows of.
    local qk = base .. 'q:' .. queue
    if state == 'delayed' and not woken[queue] then
      local first = first_later(qk, now_s)
      if not first or first > run_at then
        woken[queue] = true
      end
    end
    redis.call('ZADD', rkey(qk, pri), string.format('%.0f', run_at), m)
    redis.call('ZADD', base .. 'x:' .. queue .. ':' .. state, 0, now_s .. ':' .. id)
    if state == 'ready' then woken[queue] = true end
    reply[#reply + 1] = id
    reply[#reply + 1] = run_id
    reply[#reply + 1] = 0
  end
end

if task then
  local ids = {}
  for i = 1, #reply, 3 do ids[#ids + 1] = reply[i] end
  redis.call('HSET', base .. 'wm', task, ARGV[fire_at + 2])
  redis.call('HSET', base .. 'fires', task, cjson.encode({
    occurrence = ARGV[fire_at + 3], watermark = ARGV[fire_at + 2], fired_at = now_s,
    job_ids = ids, cron = ARGV[fire_at + 4], tz = ARGV[fire_at + 5] }))
end
for queue in pairs(woken) do
  redis.call('PUBLISH', base .. 'wake', queue)
end
return reply
