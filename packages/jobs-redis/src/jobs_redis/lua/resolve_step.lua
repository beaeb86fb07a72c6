-- resolve_step.lua: settle a once step left "started" (its outcome unknown).
--
-- KEYS[1]  <base>j:<id>  the row
-- ARGV[1]  base          "{<prefix>}:"; <base>s:<run_id> (the run's steps) is built from it
-- ARGV[2]  step          the step name
-- ARGV[3]  seen          the record JSON the caller read (compare-and-set)
-- ARGV[4]  record        the completed record JSON to store, or "" to delete the step
-- Reply:   "ok"; "missing" when no row has the id; "unresolvable" unless the step is a once step
--          in "started" whose record is still `seen`.
--
-- A deleted step leaves the others' seq alone and "#n" one past the highest left, so the next
-- attempt runs it again under a fresh seq.

local run = redis.call('HGET', KEYS[1], 'run')
if not run then return 'missing' end
local sk = ARGV[1] .. 's:' .. run
local name = ARGV[2]
if redis.call('HGET', sk, 'k:' .. name) ~= 'started!'
    or redis.call('HGET', sk, 'r:' .. name) ~= ARGV[3] then
  return 'unresolvable'
end
if ARGV[4] ~= '' then
  redis.call('HSET', sk, 'r:' .. name, ARGV[4], 'k:' .. name, 'completed!')
  return 'ok'
end
redis.call('HDEL', sk, 'r:' .. name, 'q:' .. name, 'k:' .. name)
local top = -1
for _, f in ipairs(redis.call('HKEYS', sk)) do
  if string.sub(f, 1, 2) == 'q:' then
    top = math.max(top, tonumber(redis.call('HGET', sk, f)))
  end
end
redis.call('HSET', sk, '#n', top + 1)
return 'ok'
