-- pause.lua: stop every claim from a queue (enqueues still land).
--
-- KEYS[1]  <base>paused  the paused queue names
-- ARGV[1]  queue
-- Reply:   1 when it was not paused before, else 0.

return redis.call('SADD', KEYS[1], ARGV[1])
