-- cancel.lua: stop a live row: it is "cancelled" now and frees its live key.
--
-- KEYS[1]  <base>j:<id>  the row
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag): <base>live,
--                        <base>q:<queue>:{r,s,l,f}, <base>fin:cancelled (settled rows by
--                        settle time, for retention.lua), <base>x:<queue>:<state> (the
--                        listing index, moved with the state)
-- ARGV[2]  reason        stored as the last error ("=" and the text)
-- ARGV[3]  code          stored as the last error code ("=" and the code)
-- Reply:   "ok"; "missing" when no row has the id; else the finished row's state.
--
-- A running row's next heartbeat, settle or step write fails its fence, so the worker fires the
-- body's cancel signal; the attempt it was on is counted (it ran).

local jk = KEYS[1]
local base = ARGV[1]
local row = redis.call('HMGET', jk, 'state', 'queue', 'm', 'lk', 'id', 'created', 'pri')
local state = row[1]
if not state then return 'missing' end
local src = ({ ready = 'r', delayed = 'r', suspended = 's', running = 'l' })[state]
if not src then return state end
-- Ready and delayed rows of a non-zero priority wait in their priority's set (see claim.lua).
if src == 'r' and row[7] and row[7] ~= '' and row[7] ~= '0' then src = 'r' .. row[7] end
local t = redis.call('TIME')
local now_s = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local qk = base .. 'q:' .. row[2]
redis.call('ZREM', qk .. ':' .. src, row[3])
local xm = row[6] .. ':' .. row[5]
redis.call('ZREM', base .. 'x:' .. row[2] .. ':' .. state, xm)
redis.call('ZADD', base .. 'x:' .. row[2] .. ':cancelled', 0, xm)
if state == 'running' then redis.call('HINCRBY', jk, 'att', 1) end
redis.call('HSET', jk, 'state', 'cancelled', 'updated', now_s, 'err', ARGV[2], 'errc', ARGV[3],
  'errs', '')
redis.call('HINCRBY', qk .. ':f', 'cancelled', 1)
redis.call('ZADD', base .. 'fin:cancelled', now_s, row[5])
if redis.call('HGET', base .. 'live', row[4]) == row[5] then
  redis.call('HDEL', base .. 'live', row[4])
end
return 'ok'
