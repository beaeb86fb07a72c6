-- rate_take.lua: take one token of a fleet rate bucket (a sliding-window log, jobs_core.rate).
--
-- KEYS[1]  <base>rt:<bucket>  the grant instants (ms), oldest first, the newest `limit` kept
-- ARGV[1]  limit              grants allowed per window (1..10,000)
-- ARGV[2]  per_ms             the window (ms)
-- ARGV[3]  now_ms             the request's instant (ms), or '' for the server's TIME
-- Reply:   0 when granted (the instant is appended); else the ms until the next token is free
--          (nothing is recorded).
--
-- An instant before the newest grant counts as that grant's, so the list never goes backwards.
-- The list is sorted, so the window is full exactly when the `limit`-th newest instant is
-- inside it. The key expires one window after its newest grant: by then it counts nothing.

local limit, per = tonumber(ARGV[1]), tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[3])
end
local newest = redis.call('LINDEX', KEYS[1], -1)
if newest and tonumber(newest) > now then now = tonumber(newest) end
local count = redis.call('LLEN', KEYS[1])
if count >= limit then
  local oldest = tonumber(redis.call('LINDEX', KEYS[1], count - limit))
  if oldest > now - per then
    if count > limit then redis.call('LTRIM', KEYS[1], count - limit, -1) end
    return oldest + per - now
  end
end
redis.call('RPUSH', KEYS[1], string.format('%.0f', now))
if count + 1 > limit then redis.call('LTRIM', KEYS[1], count + 1 - limit, -1) end
redis.call('PEXPIRE', KEYS[1], per)
return 0
