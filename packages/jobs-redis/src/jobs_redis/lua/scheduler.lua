-- scheduler.lua: cron watermarks, last fires and task pauses (fires themselves are enqueue.lua's).
--
-- KEYS[1]  <base>wm      task -> watermark (µs since the epoch); it routes the call
-- ARGV[1]  base          "{<prefix>}:"; keys built from it (same hash tag): <base>fires (task ->
--                        the last fire as JSON text), <base>ptasks (paused task names)
-- ARGV[2]  mode          "advance" (ARGV[3] task, ARGV[4] expected µs or "", ARGV[5] to µs),
--                        "read" (no more), "pause" or "resume" (ARGV[3] task)
-- Reply:   advance: 1 when moved, 0 (writing nothing) when the stored watermark is not the
--          expected one. read: { watermarks (flat task, µs), fires (flat task, JSON), paused
--          tasks }. pause/resume: 1.

local base = ARGV[1]
local mode = ARGV[2]
if mode == 'advance' then
  local stored = redis.call('HGET', KEYS[1], ARGV[3]) or ''
  if stored ~= ARGV[4] then return 0 end
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[5])
  return 1
elseif mode == 'read' then
  return { redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', base .. 'fires'),
    redis.call('SMEMBERS', base .. 'ptasks') }
elseif mode == 'pause' then
  redis.call('SADD', base .. 'ptasks', ARGV[3])
else
  redis.call('SREM', base .. 'ptasks', ARGV[3])
end
return 1
