-- workers.lua: the worker registry: one row per live worker, expiring one TTL after its beat.
--
-- KEYS[1]  <base>workers  worker id -> expiry (µs since the epoch), a sorted set
-- ARGV[1]  base           "{<prefix>}:"; <base>w:<id> (the worker's row as JSON text, with a
--                         Redis expiry too, so a dead worker's row goes by itself)
-- ARGV[2]  mode           "beat" (ARGV[3] id, ARGV[4] the row's JSON text without its
--                         last_heartbeat, ARGV[5] ttl_ms), "remove" (ARGV[3] id) or "list"
-- Reply:   beat: the heartbeat instant (µs). remove: 1. list: flat id, row JSON, heartbeat µs
--          for every unexpired worker (expired ones are dropped).

local base = ARGV[1]
local mode = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)
if mode == 'beat' then
  local ttl = tonumber(ARGV[5])
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl * 1000), ARGV[3])
  redis.call('HSET', base .. 'w:' .. ARGV[3], 'row', ARGV[4], 'beat', now_s)
  redis.call('PEXPIRE', base .. 'w:' .. ARGV[3], ttl)
  return now_s
elseif mode == 'remove' then
  redis.call('ZREM', KEYS[1], ARGV[3])
  redis.call('DEL', base .. 'w:' .. ARGV[3])
  return 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_s)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local row = redis.call('HMGET', base .. 'w:' .. id, 'row', 'beat')
  if row[1] then
    out[#out + 1] = id
    out[#out + 1] = row[1]
    out[#out + 1] = row[2]
  end
end
return out
