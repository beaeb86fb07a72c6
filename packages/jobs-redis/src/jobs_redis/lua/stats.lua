-- stats.lua: counts per queue that ever had a row.
--
-- KEYS[1]  <base>queues  the queue names
-- ARGV[1]  base          "{<prefix>}:"; <base>q:<queue>:{r,s,l,f} are built from it
-- Reply:   11 values per queue: name, ready, delayed, running, suspended, done, failed, dead,
--          cancelled, oldest ready run_at (µs, "" when none is due), now (µs).
--
-- "ready" counts ready/delayed rows whose run_at passed, "delayed" the rest. Finished states
-- count settles as they happen (a done row that expired stays counted).

local base = ARGV[1]
local t = redis.call('TIME')
local now_s = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local out = {}
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local qk = base .. 'q:' .. queue
  -- Ready/delayed rows wait in one set per priority (see claim.lua).
  local ready, waiting, oldest = 0, 0, nil
  local sets = { qk .. ':r' }
  for _, p in ipairs(redis.call('ZRANGE', qk .. ':rp', 0, -1)) do sets[#sets + 1] = qk .. ':r' .. p end
  for _, rk in ipairs(sets) do
    local due = redis.call('ZCOUNT', rk, '-inf', now_s)
    ready = ready + due
    waiting = waiting + redis.call('ZCARD', rk)
    if due > 0 then
      local first = tonumber(redis.call('ZRANGE', rk, 0, 0, 'WITHSCORES')[2])
      if not oldest or first < oldest then oldest = first end
    end
  end
  local fin = redis.call('HMGET', qk .. ':f', 'done', 'failed', 'dead', 'cancelled')
  if oldest then oldest = string.format('%.0f', oldest) else oldest = '' end
  local row = { queue, ready, waiting - ready,
    redis.call('ZCARD', qk .. ':l'), redis.call('ZCARD', qk .. ':s') }
  for _, v in ipairs(fin) do row[#row + 1] = v or '0' end
  row[#row + 1] = oldest
  row[#row + 1] = now_s
  for _, v in ipairs(row) do out[#out + 1] = v end
end
return out
