-- resume.lua: let claims take a queue's rows again, and wake workers for it.
--
-- KEYS[1]  <base>paused  the paused queue names
-- ARGV[1]  queue
-- ARGV[2]  channel       <base>wake, published when the queue was paused
-- Reply:   1 when it was paused, else 0.

local was = redis.call('SREM', KEYS[1], ARGV[1])
if was == 1 then redis.call('PUBLISH', ARGV[2], ARGV[1]) end
return was
