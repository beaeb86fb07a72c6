-- step_load.lua: read every step of a run.
--
-- KEYS[1]  <base>s:<run_id>  the run's steps (see step_write.lua for the fields)
-- Reply:   flat field/value pairs of the records and their seqs: r:<name> (record JSON) and
--          q:<name> (seq); bookkeeping fields are left out.

local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local kind = string.sub(all[i], 1, 2)
  if kind == 'r:' or kind == 'q:' then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
