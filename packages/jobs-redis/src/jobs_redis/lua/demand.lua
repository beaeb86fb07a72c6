-- demand.lua: per queue, rows running under a live lease plus rows due and claimable.
--
-- KEYS[1]  <base>queues  the queue names
-- ARGV[1]  base          "{<prefix>}:"; <base>paused and <base>q:<queue>:{r,s,l} are built
--                        from it
-- Reply:   2 values per queue: name, demand. A paused queue counts only its leased rows.

local base = ARGV[1]
local t = redis.call('TIME')
local now_s = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local out = {}
for _, queue in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local qk = base .. 'q:' .. queue
  local n = redis.call('ZCOUNT', qk .. ':l', '(' .. now_s, '+inf')
  if redis.call('SISMEMBER', base .. 'paused', queue) == 0 then
    n = n + redis.call('ZCOUNT', qk .. ':l', '-inf', now_s)
      + redis.call('ZCOUNT', qk .. ':r', '-inf', now_s)
      + redis.call('ZCOUNT', qk .. ':s', '-inf', now_s)
    for _, p in ipairs(redis.call('ZRANGE', qk .. ':rp', 0, -1)) do
      n = n + redis.call('ZCOUNT', qk .. ':r' .. p, '-inf', now_s)
    end
  end
  out[#out + 1] = queue
  out[#out + 1] = n
end
return out
