-- progress.lua: store a running row's progress, fenced on its claim like an ack.
--
-- KEYS[1]  <base>j:<id>  the row
-- ARGV[1]  worker        the fence's worker id
-- ARGV[2]  claim         the fence's claim ordinal
-- ARGV[3]  progress      JSON text
-- Reply:   1 when stored; 0, changing nothing, when the row is not running under the fence.

local row = redis.call('HMGET', KEYS[1], 'state', 'by', 'claim')
if row[1] ~= 'running' or row[2] ~= '=' .. ARGV[1] or row[3] ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
local now_s = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HSET', KEYS[1], 'prog', ARGV[3], 'updated', now_s)
return 1
