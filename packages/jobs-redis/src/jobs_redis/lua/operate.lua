-- operate.lua: the operator surface over the listing index: list, count, and the requeue,
-- remove and promote of one row or of the rows a filter matches.
--
-- KEYS[1]  <base>queues  the queue names; it routes the call (every key shares its hash tag)
-- ARGV[1]  base          "{<prefix>}:"; keys built from it: <base>j:<id> (row), <base>s:<run_id>
--                        (steps), <base>live, <base>wake (channel),
--                        <base>q:<queue>:{r,s,f}, <base>fin:<state>, and the listing index
--                        <base>x:<queue>:<state>: one sorted set per queue and state, every
--                        score 0, members "<created µs, 16 digits>:<id>", so lexicographic order
--                        is (created_at, id) order and a cursor is an exclusive ZRANGE BYLEX bound
-- ARGV[2]  mode          "one" (ARGV[3] op, ARGV[4] job id, ARGV[5] from_step or "" for none),
--                        or "walk" (the rest below)
-- Walk:    ARGV[3] op (list, requeue, remove or promote; "count:" and one of the last three
--          counts the rows that op would change, changing nothing), ARGV[4] direction ("older":
--          newest first, or "newer": oldest first), ARGV[5] the bound to start from and
--          ARGV[6] the bound to stop at (BYLEX bounds: "(" or "[" and a member, or "+"/"-"),
--          ARGV[7] queue, ARGV[8] state ("" for any), ARGV[9] name, ARGV[10] tenant ("" for
--          any, else "=" and the text), ARGV[11] id prefix ("" for any), ARGV[12] the most rows
--          to find, ARGV[13] the most index members to look at in this call.
-- Reply:   one: "ok"; "missing"; "live:<state>" (requeue of a live row); "dup:<id>" (its key is
--          held); "nostep" (from_step unknown); "running" (remove); "waiting:<state>" (promote).
--          walk: { found, resume }: found holds each row's HGETALL (list) or the count of rows
--          matched (count) or changed (the others); resume is "" when the walk is over (the
--          index ran out or enough was found), else the bound to pass as ARGV[5] next time.
--
-- An index member whose row is gone (a done row whose done_ttl lapsed) is dropped when met.
-- Requeue, remove and promote keep every structure the other scripts keep in step: the queue
-- sets, the live keys, the finished counts, the settled sets and the index.

local base = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)
local live = base .. 'live'
local FINISHED = { done = true, failed = true, dead = true, cancelled = true }
local ALL = { 'ready', 'delayed', 'running', 'suspended', 'done', 'failed', 'dead', 'cancelled' }
local OP_STATES = {
  requeue = { 'done', 'failed', 'dead', 'cancelled' },
  remove = { 'ready', 'delayed', 'suspended', 'done', 'failed', 'dead', 'cancelled' },
  promote = { 'delayed', 'suspended' },
}

local function index_key(queue, state) return base .. 'x:' .. queue .. ':' .. state end

-- The ready/delayed set of a row's priority (see claim.lua): <base>q:<queue>:r, or :r<p> for a
-- non-zero p, listed in :rp when a row goes in.
local function ready_key(qk, jk, adding)
  local pri = redis.call('HGET', jk, 'pri')
  if not pri or pri == '' or pri == '0' then return qk .. ':r' end
  if adding then redis.call('ZADD', qk .. ':rp', pri, pri) end
  return qk .. ':r' .. pri
end

local function requeue_check(jk, row)
  if not FINISHED[row[1]] then return 'live:' .. row[1] end
  local holder = redis.call('HGET', live, row[3])
  if holder and holder ~= row[4] then return 'dup:' .. holder end
  return nil
end

local function cut_steps(run, from_step, id)
  local sk = base .. 's:' .. run
  local cut = redis.call('HGET', sk, 'q:' .. from_step)
  if not cut then return false end
  cut = tonumber(cut)
  local all = redis.call('HGETALL', sk)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'q:' and tonumber(all[i + 1]) >= cut then
      local name = string.sub(all[i], 3)
      local event = redis.call('HGET', sk, 'w:' .. name)
      if event then redis.call('HDEL', base .. 'evw:' .. event, id .. '|' .. name) end
      redis.call('HDEL', sk, 'r:' .. name, 'q:' .. name, 'k:' .. name, 'w:' .. name)
    end
  end
  return true
end

-- row: state, queue, lk, id, run, created
local function requeue(jk, row, from_step)
  local refused = requeue_check(jk, row)
  if refused then return refused end
  if from_step ~= '' and not cut_steps(row[5], from_step, row[4]) then return 'nostep' end
  local qk = base .. 'q:' .. row[2]
  local xm = row[6] .. ':' .. row[4]
  redis.call('HINCRBY', qk .. ':f', row[1], -1)
  redis.call('ZREM', base .. 'fin:' .. row[1], row[4])
  redis.call('ZREM', index_key(row[2], row[1]), xm)
  redis.call('ZADD', index_key(row[2], 'ready'), 0, xm)
  -- The row keeps its sequence, so it orders among rows due with it as at its enqueue.
  local m = redis.call('HGET', jk, 'm')
  -- A requeued row holds its key like any other (a debounced one too: 'db' is cleared).
  redis.call('HSET', jk, 'state', 'ready', 'att', 0, 'run_at', now_s, 'vis', '',
    'result', 'null', 'prog', 'null', 'updated', now_s, 'db', '')
  redis.call('PERSIST', jk)
  redis.call('PERSIST', base .. 's:' .. row[5])
  redis.call('HSET', live, row[3], row[4])
  redis.call('ZADD', ready_key(qk, jk, true), now_s, m)
  redis.call('PUBLISH', base .. 'wake', row[2])
  return 'ok'
end

local function remove(jk, row)
  if row[1] == 'running' then return 'running' end
  local qk = base .. 'q:' .. row[2]
  if FINISHED[row[1]] then
    redis.call('HINCRBY', qk .. ':f', row[1], -1)
    redis.call('ZREM', base .. 'fin:' .. row[1], row[4])
  else
    local src = ready_key(qk, jk, false)
    if row[1] == 'suspended' then src = qk .. ':s' end
    redis.call('ZREM', src, redis.call('HGET', jk, 'm'))
    if redis.call('HGET', live, row[3]) == row[4] then redis.call('HDEL', live, row[3]) end
  end
  redis.call('ZREM', index_key(row[2], row[1]), row[6] .. ':' .. row[4])
  redis.call('DEL', jk, base .. 's:' .. row[5])
  return 'ok'
end

local function promote(jk, row)
  local run_at = tonumber(redis.call('HGET', jk, 'run_at'))
  if (row[1] ~= 'delayed' and row[1] ~= 'suspended') or run_at <= now then
    return 'waiting:' .. row[1]
  end
  local qk = base .. 'q:' .. row[2]
  local m = redis.call('HGET', jk, 'm')
  if row[1] == 'delayed' then
    local xm = row[6] .. ':' .. row[4]
    redis.call('ZREM', index_key(row[2], 'delayed'), xm)
    redis.call('ZADD', index_key(row[2], 'ready'), 0, xm)
    redis.call('HSET', jk, 'state', 'ready', 'run_at', now_s, 'updated', now_s)
    redis.call('ZADD', ready_key(qk, jk, true), now_s, m)
  else
    redis.call('HSET', jk, 'run_at', now_s, 'updated', now_s)
    redis.call('ZADD', qk .. ':s', now_s, m)
  end
  redis.call('PUBLISH', base .. 'wake', row[2])
  return 'ok'
end

local function fields(jk)
  return redis.call('HMGET', jk, 'state', 'queue', 'lk', 'id', 'run', 'created')
end

local function apply(op, jk, row, from_step)
  if op == 'requeue' then return requeue(jk, row, from_step) end
  if op == 'remove' then return remove(jk, row) end
  return promote(jk, row)
end

if ARGV[2] == 'one' then
  local jk = base .. 'j:' .. ARGV[4]
  local row = fields(jk)
  if not row[1] then return 'missing' end
  return apply(ARGV[3], jk, row, ARGV[5])
end

local op, older = ARGV[3], ARGV[4] == 'older'
local counting = string.sub(op, 1, 6) == 'count:'
if counting then op = string.sub(op, 7) end
local from, stop = ARGV[5], ARGV[6]
local want_queue, want_state = ARGV[7], ARGV[8]
local name, tenant, prefix = ARGV[9], ARGV[10], ARGV[11]
local want, budget = tonumber(ARGV[12]), tonumber(ARGV[13])

local queues = { want_queue }
if want_queue == '' then queues = redis.call('SMEMBERS', KEYS[1]) end
local states = OP_STATES[op] or ALL
if want_state ~= '' then
  states = {}
  for _, s in ipairs(OP_STATES[op] or ALL) do
    if s == want_state then states = { s } end
  end
end
local sources = {}
for _, q in ipairs(queues) do
  for _, s in ipairs(states) do sources[#sources + 1] = { index_key(q, s), q, s } end
end

-- Does the row behind member xm of source src match, and may op change it?
local function eligible(xm, src)
  local id = string.sub(xm, 18)
  if prefix ~= '' and string.sub(id, 1, #prefix) ~= prefix then return nil end
  local jk = base .. 'j:' .. id
  local row = redis.call('HMGET', jk, 'state', 'queue', 'lk', 'id', 'run', 'created', 'name',
    'tenant')
  if not row[1] then
    redis.call('ZREM', src[1], xm)
    return nil
  end
  if row[1] ~= src[3] then return nil end
  if name ~= '' and row[7] ~= string.sub(name, 2) then return nil end
  if tenant ~= '' and row[8] ~= tenant then return nil end
  if op == 'requeue' and requeue_check(jk, row) then return nil end
  if op == 'promote' and tonumber(redis.call('HGET', jk, 'run_at')) <= now then return nil end
  return jk, row
end

local found, hits, seen = {}, 0, 0
local resume = ''
while hits < want do
  if seen >= budget then
    resume = from
    break
  end
  local chunk = math.min(200, budget - seen)
  local merged = {}
  for _, src in ipairs(sources) do
    local got
    if older then
      got = redis.call('ZRANGE', src[1], from, stop, 'BYLEX', 'REV', 'LIMIT', 0, chunk)
    else
      got = redis.call('ZRANGE', src[1], from, stop, 'BYLEX', 'LIMIT', 0, chunk)
    end
    for _, xm in ipairs(got) do merged[#merged + 1] = { xm, src } end
  end
  if #merged == 0 then break end
  if older then
    table.sort(merged, function(a, b) return a[1] > b[1] end)
  else
    table.sort(merged, function(a, b) return a[1] < b[1] end)
  end
  for i = 1, math.min(chunk, #merged) do
    local xm, src = merged[i][1], merged[i][2]
    seen = seen + 1
    from = '(' .. xm
    local jk, row = eligible(xm, src)
    if jk then
      hits = hits + 1
      if op == 'list' then
        found[#found + 1] = redis.call('HGETALL', jk)
      elseif not counting then
        apply(op, jk, row, '')
      end
      if hits >= want then break end
    end
  end
end
if op ~= 'list' then found = hits end
return { found, resume }
