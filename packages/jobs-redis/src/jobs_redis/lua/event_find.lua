-- event_find.lua: the earliest unexpired event of a name that a wait's filters accept.
--
-- KEYS[1]  <base>evn:<name>  events of the name, scored by published_at (µs), members
--                            "<seq>:<id>" so one microsecond keeps publish order
-- ARGV[1]  base              "{<prefix>}:"; <base>ev:<id> (the event) is built from it
-- ARGV[2]  since             only events published at or after this instant (µs)
-- ARGV[3]  correlation       "" for any, else "=" and the key the event must carry
-- ARGV[4]  match             the wait's match in canonical JSON (an object of texts), or ""
-- Reply:   { id, payload, correlation, published_at, expires_at } of the event, or {} for none.
--
-- Expired events stay until purge (event_purge.lua) but never match.

local base = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local want = nil
if ARGV[4] ~= '' then
  want = cjson.decode(ARGV[4])
  if next(want) == nil then want = nil end
end
local members = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[2], '+inf')
for _, member in ipairs(members) do
  local id = string.sub(member, 18)
  local ev = redis.call('HMGET', base .. 'ev:' .. id, 'payload', 'ck', 'pub', 'exp', 'canon')
  local ok = tonumber(ev[4]) > now and (ARGV[3] == '' or ev[2] == ARGV[3])
  if ok and want ~= nil then
    if ev[5] == '' then
      ok = false
    else
      local canon = cjson.decode(ev[5])
      for k, v in pairs(want) do
        if canon[k] ~= v then ok = false end
      end
    end
  end
  if ok then return { id, ev[1], ev[2], ev[3], ev[4] } end
end
return {}
