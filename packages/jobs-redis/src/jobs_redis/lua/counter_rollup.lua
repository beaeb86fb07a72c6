-- counter_rollup.lua: fold aged counter buckets into the next tier, drop expired last-tier ones.
--
-- KEYS[1]  <base>cn      the job names with counters (a set; a name left without buckets leaves)
-- ARGV[1]  base          "{<prefix>}:"; <base>cz:<tier>:<name> and
--                        <base>cb:<tier>:<start ms>:<name> are built from it (see counters.lua)
-- ARGV[2]  limit         the most buckets this call folds or drops
-- ARGV[3]  now_ms        the instant to fold at (ms since the epoch), or "" for the server's TIME
-- ARGV[4…] the tiers finest first, 3 values each: the tier's name, its bucket width in ms and how
--          long its buckets are kept in ms
-- Reply:   { changed, more }: how many buckets were folded or dropped, and 1 when `limit` ended
--          the call with aged buckets possibly left (call again), else 0.
--
-- A bucket ages once its whole parent bucket (for the last tier: the bucket itself) ended more
-- than its tier's retention ago, so the tiers never overlap in time. Per name the tiers fold in
-- order, so a minute bucket old enough to fold twice ends in its hour bucket in one call. Each
-- call is atomic: two schedulers rolling up at once fold every bucket exactly once between them.

local base = ARGV[1]
local limit = tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[3])
end
local tiers = {}
for i = 4, #ARGV, 3 do
  tiers[#tiers + 1] = { ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]) }
end
local fields = { 'done', 'retried', 'failed', 'dead' }
local changed = 0
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local left = 0
  for i, spec in ipairs(tiers) do
    local tier, kept = spec[1], spec[3]
    local parent = tiers[i + 1]
    local span = spec[2]
    if parent then span = parent[2] end
    local zk = base .. 'cz:' .. tier .. ':' .. name
    local bound = math.floor((now - kept) / span) * span
    local aged = redis.call('ZRANGEBYSCORE', zk, '-inf', '(' .. string.format('%.0f', bound),
      'LIMIT', 0, limit - changed)
    for _, start in ipairs(aged) do
      local bk = base .. 'cb:' .. tier .. ':' .. start .. ':' .. name
      if parent then
        local v = redis.call('HMGET', bk, 'done', 'retried', 'failed', 'dead', 'dur')
        local into = string.format('%.0f', math.floor(tonumber(start) / span) * span)
        local pk = base .. 'cb:' .. parent[1] .. ':' .. into .. ':' .. name
        for j, field in ipairs(fields) do
          if v[j] and v[j] ~= '0' then redis.call('HINCRBY', pk, field, v[j]) end
        end
        if v[5] then redis.call('HINCRBYFLOAT', pk, 'dur', v[5]) end
        redis.call('ZADD', base .. 'cz:' .. parent[1] .. ':' .. name, into, into)
      end
      redis.call('DEL', bk)
      redis.call('ZREM', zk, start)
      changed = changed + 1
    end
    if changed >= limit then return { changed, 1 } end
    left = left + redis.call('ZCARD', zk)
  end
  if left == 0 then redis.call('SREM', KEYS[1], name) end
end
return { changed, 0 }
