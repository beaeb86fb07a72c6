-- lease_acquire.lua: take (or renew, for a holder that has one) a fleet concurrency slot.
--
-- KEYS[1]  <base>ls:<key>  holders in slot order (scored by the sequence at acquisition)
-- KEYS[2]  <base>lx:<key>  holder -> expiry (µs)
-- KEYS[3]  <base>seq       the sequence counter
-- ARGV[1]  holder          who takes the slot (a run id)
-- ARGV[2]  limit           how many holders the key admits (>= 1)
-- ARGV[3]  ttl_ms          the slot expires this long after now (>= 1)
-- Reply:   1 when held; 0 when `limit` other holders hold unexpired slots.
--
-- Expired slots are dropped first. Both keys expire with their last slot, so a key whose
-- holders all died leaves nothing behind.

local holder, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for _, h in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if tonumber(redis.call('HGET', KEYS[2], h) or '0') <= now then
    redis.call('ZREM', KEYS[1], h)
    redis.call('HDEL', KEYS[2], h)
  end
end
if redis.call('HEXISTS', KEYS[2], holder) == 0 then
  if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
  redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[3]), holder)
end
redis.call('HSET', KEYS[2], holder, string.format('%.0f', now + ttl * 1000))
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
