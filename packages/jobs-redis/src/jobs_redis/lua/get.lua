-- get.lua: one row with its steps, read together.
--
-- KEYS[1]  <base>j:<id>  the row
-- ARGV[1]  base          "{<prefix>}:"; <base>s:<run_id> (its steps) is built from it
-- Reply:   { row fields and values, step fields and values } or {} when no row has the id.

local row = redis.call('HGETALL', KEYS[1])
if #row == 0 then return {} end
local run = redis.call('HGET', KEYS[1], 'run')
return { row, redis.call('HGETALL', ARGV[1] .. 's:' .. run) }
