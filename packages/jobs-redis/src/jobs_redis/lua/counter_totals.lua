-- counter_totals.lua: per job name, the sums of its counter buckets that end after an instant.
--
-- KEYS[1]  <base>cn      the job names with counters (a set)
-- ARGV[1]  base          "{<prefix>}:"; <base>cz:<tier>:<name> and
--                        <base>cb:<tier>:<start ms>:<name> are built from it (see counters.lua)
-- ARGV[2]  since_us      sum the buckets that end after this instant (µs since the epoch)
-- ARGV[3…] the tiers finest first, 2 values each: the tier's name and its bucket width in ms
-- Reply:   7 values per job name with such a bucket, by name: name, done, retried, failed, dead,
--          duration ms, and the coarsest tier summed.
--
-- Walks the name index and each name's tier indexes, never the keyspace.

local base = ARGV[1]
local since_ms = tonumber(ARGV[2]) / 1000
local names = redis.call('SMEMBERS', KEYS[1])
table.sort(names)
local out = {}
for _, name in ipairs(names) do
  local sums = { 0, 0, 0, 0, 0 }
  local coarsest = nil
  for i = 3, #ARGV, 2 do
    local tier, width = ARGV[i], tonumber(ARGV[i + 1])
    local starts = redis.call('ZRANGEBYSCORE', base .. 'cz:' .. tier .. ':' .. name,
      '(' .. string.format('%.3f', since_ms - width), '+inf')
    for _, start in ipairs(starts) do
      local v = redis.call('HMGET', base .. 'cb:' .. tier .. ':' .. start .. ':' .. name, 'done',
        'retried', 'failed', 'dead', 'dur')
      for j = 1, 5 do sums[j] = sums[j] + (tonumber(v[j]) or 0) end
      coarsest = tier
    end
  end
  if coarsest then
    out[#out + 1] = name
    for j = 1, 4 do out[#out + 1] = string.format('%.0f', sums[j]) end
    out[#out + 1] = string.format('%.17g', sums[5])
    out[#out + 1] = coarsest
  end
end
return out
