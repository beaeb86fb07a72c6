-- event_publish.lua: store an event and make every matching waiting run due now.
--
-- KEYS[1]  <base>seq     the sequence counter (orders events published in one microsecond)
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag): <base>ev:<id> (the
--                        event), <base>evn:<name> (events of a name by published_at),
--                        <base>evx (every event by expiry), <base>evw:<name> (waiting steps:
--                        "<job id>|<step>" -> canonical match), <base>j:<id> (rows),
--                        <base>q:<queue>:s (suspended rows by run_at), <base>wake (channel)
-- ARGV[2]  id            the event id
-- ARGV[3]  name          the event name
-- ARGV[4]  payload       the payload, JSON text
-- ARGV[5]  correlation   optional: "" for None, else "=" and the key
-- ARGV[6]  ttl_ms        the event stays matchable this long
-- ARGV[7]  canonical     the payload's top-level values in canonical JSON (an object of texts),
--                        or "" when the payload is not an object
-- Reply:   { published_at µs, expires_at µs } as text.
--
-- A suspended run whose run_at is still ahead and whose waiting step for this name has a match
-- the payload satisfies is made due now, and its queue published on <base>wake. Index entries of
-- rows that are no longer live are dropped on the way.

local base = ARGV[1]
local id, name = ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)
local exp_s = string.format('%.0f', now + tonumber(ARGV[6]) * 1000)
local seq = redis.call('INCR', KEYS[1])
local member = string.format('%016d', seq) .. ':' .. id
redis.call('HSET', base .. 'ev:' .. id, 'name', name, 'payload', ARGV[4], 'ck', ARGV[5],
  'pub', now_s, 'exp', exp_s, 'canon', ARGV[7], 'm', member)
redis.call('ZADD', base .. 'evn:' .. name, now_s, member)
redis.call('ZADD', base .. 'evx', exp_s, member)

local canon = nil
if ARGV[7] ~= '' then canon = cjson.decode(ARGV[7]) end
local function satisfied(match)
  if match == '' then return true end
  local want = cjson.decode(match)
  if next(want) == nil then return true end
  if canon == nil then return false end
  for k, v in pairs(want) do
    if canon[k] ~= v then return false end
  end
  return true
end

local live = { ready = true, delayed = true, running = true, suspended = true }
local waiters = base .. 'evw:' .. name
local all = redis.call('HGETALL', waiters)
local woken = {}
for i = 1, #all, 2 do
  local job = string.sub(all[i], 1, 36)
  local jk = base .. 'j:' .. job
  local row = redis.call('HMGET', jk, 'state', 'run_at', 'queue', 'm')
  if not live[row[1]] then
    redis.call('HDEL', waiters, all[i])
  elseif row[1] == 'suspended' and tonumber(row[2]) > now and satisfied(all[i + 1]) then
    redis.call('HSET', jk, 'run_at', now_s, 'updated', now_s)
    redis.call('ZADD', base .. 'q:' .. row[3] .. ':s', now_s, row[4])
    woken[row[3]] = true
  end
end
for queue in pairs(woken) do
  redis.call('PUBLISH', base .. 'wake', queue)
end
return { now_s, exp_s }
