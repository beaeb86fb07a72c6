-- children.lua: a run's child jobs (step.invoke/step.gather), in insertion order.
--
-- KEYS[1]  <base>c:<run_id>  the parent run's children (sorted set: job id by row seq)
-- ARGV[1]  base              "{<prefix>}:"; <base>j:<id> (a row) is built from it
-- ARGV[2…] job ids to answer (none: every child)
-- Reply:   { row fields and values, ... } for the children that still have a row; a member
--          whose row is gone (removed, purged, expired) is dropped from the set.

local wanted = nil
if #ARGV > 1 then
  wanted = {}
  for i = 2, #ARGV do wanted[ARGV[i]] = true end
end
local reply = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if wanted == nil or wanted[id] then
    local row = redis.call('HGETALL', ARGV[1] .. 'j:' .. id)
    if #row == 0 then
      redis.call('ZREM', KEYS[1], id)
    else
      reply[#reply + 1] = row
    end
  end
end
return reply
