-- lock_release: delete the locks in KEYS that still hold our token; leave every other alone.
-- KEYS[1..n] lock keys (one hash tag)
-- ARGV[1] token of the acquisition being released
-- Returns the number of keys deleted (n when every lock was still ours).
-- Fencing counters are kept: tokens must keep rising for the next holder.
local mine = ARGV[1] .. '|'
local released = 0
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value and string.sub(value, 1, #mine) == mine then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
return released
