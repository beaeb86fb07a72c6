-- counters.lua: one job's outcome counter buckets that end after an instant, the newest first.
--
-- KEYS[1]  <base>cn      the job names with counters (routes the call; not read)
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag):
--                        <base>cz:<tier>:<name> (a tier's bucket starts in ms, each scored by
--                        itself), <base>cb:<tier>:<start ms>:<name> (one bucket: a hash of
--                        done, retried, failed, dead and dur, the summed duration in ms)
-- ARGV[2]  name          the job name
-- ARGV[3]  since_us      answer the buckets that end after this instant (µs since the epoch)
-- ARGV[4]  limit         the most buckets answered: the newest
-- ARGV[5…] the tiers, 2 values each: the tier's name and its bucket width in ms
-- Reply:   7 values per bucket, oldest first (one start in two tiers: by tier name): tier, start
--          ms, done, retried, failed, dead, duration ms.
--
-- The settling scripts (ack.lua, nack.lua, claim.lua for burials) add to the 1-minute bucket
-- holding the server's now; counter_rollup.lua folds aged buckets into the coarser tiers. Each
-- tier's starts are a sorted set, so a bucket ends after `since` exactly when its start is above
-- since minus its width: one range read per tier.

local base, name = ARGV[1], ARGV[2]
local since_ms = tonumber(ARGV[3]) / 1000
local limit = tonumber(ARGV[4])
local found = {}
for i = 5, #ARGV, 2 do
  local tier, width = ARGV[i], tonumber(ARGV[i + 1])
  local starts = redis.call('ZREVRANGEBYSCORE', base .. 'cz:' .. tier .. ':' .. name, '+inf',
    '(' .. string.format('%.3f', since_ms - width), 'LIMIT', 0, limit)
  for _, start in ipairs(starts) do found[#found + 1] = { tonumber(start), tier, start } end
end
-- The newest `limit` across the tiers, then oldest first.
table.sort(found, function(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  return a[2] < b[2]
end)
local kept = {}
for i = 1, math.min(limit, #found) do kept[i] = found[i] end
table.sort(kept, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end)
local out = {}
for _, b in ipairs(kept) do
  local v = redis.call('HMGET', base .. 'cb:' .. b[2] .. ':' .. b[3] .. ':' .. name, 'done',
    'retried', 'failed', 'dead', 'dur')
  out[#out + 1] = b[2]
  out[#out + 1] = b[3]
  for j = 1, 5 do out[#out + 1] = v[j] or '0' end
end
return out
