-- step_write.lua: insert or replace one step record of a run, fenced on the job's claim.
--
-- KEYS[1]  <base>s:<run_id>  the run's steps: r:<name> (record JSON), q:<name> (seq),
--                            k:<name> (status, "!" appended for a once step), w:<name> (the
--                            event a waiting step waits for), "#n" (the next seq)
-- ARGV[1]  base              "{<prefix>}:"; keys built from it (same hash tag): <base>j:<id>
--                            (the row), <base>evw:<event> (waiting steps by event)
-- ARGV[2]  job_id            "" for a run_inline write (no fence)
-- ARGV[3]  worker            the fence's worker id
-- ARGV[4]  claim             the fence's claim ordinal
-- ARGV[5]  run_id            the run the step belongs to (the row must be this run's)
-- ARGV[6]  name              the step name
-- ARGV[7]  record            the record as JSON text (without seq)
-- ARGV[8]  status            started, completed, waiting or failed ("!" appended for once)
-- ARGV[9]  event             for a waiting step of a fenced write: its event name, else ""
-- ARGV[10] match             that step's match as canonical JSON (see _codec.py), or ""
-- Reply:   the step's seq when written; -1, writing nothing, when the fence does not hold.
--
-- A first insert gets seq "#n" (one past the run's highest); a replacement keeps its seq. A
-- waiting step is indexed under its event so a publish finds the runs to wake without a scan.

local sk = KEYS[1]
local base = ARGV[1]
local job = ARGV[2]
local name = ARGV[6]
if job ~= '' then
  local row = redis.call('HMGET', base .. 'j:' .. job, 'state', 'by', 'claim', 'run')
  if row[1] ~= 'running' or row[2] ~= '=' .. ARGV[3] or row[3] ~= ARGV[4]
      or row[4] ~= ARGV[5] then
    return -1
  end
end
local old_event = redis.call('HGET', sk, 'w:' .. name)
if old_event then
  redis.call('HDEL', base .. 'evw:' .. old_event, job .. '|' .. name)
  redis.call('HDEL', sk, 'w:' .. name)
end
local seq = redis.call('HGET', sk, 'q:' .. name)
if not seq then
  seq = tonumber(redis.call('HGET', sk, '#n') or '0')
  redis.call('HSET', sk, '#n', seq + 1, 'q:' .. name, seq)
end
redis.call('HSET', sk, 'r:' .. name, ARGV[7], 'k:' .. name, ARGV[8])
if ARGV[9] ~= '' and job ~= '' then
  redis.call('HSET', sk, 'w:' .. name, ARGV[9])
  redis.call('HSET', base .. 'evw:' .. ARGV[9], job .. '|' .. name, ARGV[10])
end
return tonumber(seq)
