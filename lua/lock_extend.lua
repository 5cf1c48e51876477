-- lock_extend: reset the lease of the locks in KEYS that still hold our token.
-- KEYS[1..n] lock keys (one hash tag)
-- ARGV[1] token of the acquisition, ARGV[2] new remaining lease in ms
-- Returns the number of keys extended (fewer than n means a lease was lost).
-- Idempotent: running it twice sets the same lease again.
local mine = ARGV[1] .. '|'
local extended = 0
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value and string.sub(value, 1, #mine) == mine then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    extended = extended + 1
  end
end
return extended
