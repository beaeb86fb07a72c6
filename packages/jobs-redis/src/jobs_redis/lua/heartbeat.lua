-- heartbeat.lua: renew a running row's lease, fenced on its claim.
--
-- KEYS[1]  <base>j:<id>  the row
-- ARGV[1]  base          "{<prefix>}:"; <base>q:<queue>:l (running rows by lease expiry) is
--                        built from it (same hash tag)
-- ARGV[2]  worker        the fence's worker id
-- ARGV[3]  claim         the fence's claim ordinal
-- ARGV[4]  vt_ms         the lease runs until the server's now plus this
-- Reply:   1 when renewed; 0 when the row was cancelled, settled or re-claimed.
--
-- A lease that lapsed but was not yet re-claimed is renewed too: nobody else owns the row.

local jk = KEYS[1]
local row = redis.call('HMGET', jk, 'state', 'by', 'claim', 'queue', 'm')
if row[1] ~= 'running' or row[2] ~= '=' .. ARGV[2] or row[3] ~= ARGV[3] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_s = string.format('%.0f', now + tonumber(ARGV[4]) * 1000)
redis.call('HSET', jk, 'vis', until_s)
redis.call('ZADD', ARGV[1] .. 'q:' .. row[4] .. ':l', 'XX', until_s, row[5])
return 1
