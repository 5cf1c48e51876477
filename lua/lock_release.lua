-- lock_release: delete the locks in KEYS that still hold our token; leave every other alone.
-- KEYS[1..n] lock keys (one hash tag)
-- ARGV[1] token of the acquisition being released
-- ARGV[2] (optional) wake-up list TTL in ms, ARGV[3] hand-over window in ms; then
--         KEYS[n+1..2n] are the names' waiting markers and KEYS[2n+1..3n] their wake-up
--         lists (same hash tag). For each name released while its marker says someone
--         waits, one element is pushed onto its list (kept at one element, living ARGV[2]
--         ms) and the name is handed over ('~' for ARGV[3] ms), as in lock_release_one.
-- Returns the number of keys deleted (n when every lock was still ours).
-- Fencing counters are kept: tokens must keep rising for the next holder.
local n = ARGV[2] and #KEYS / 3 or #KEYS
local mine = ARGV[1] .. '|'
local released = 0
for i = 1, n do
  local value = redis.call('GET', KEYS[i])
  if value and string.sub(value, 1, #mine) == mine then
    released = released + 1
    if not (ARGV[2] and redis.call('EXISTS', KEYS[n + i]) == 1) then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], '~', 'PX', ARGV[3])
      local wake = KEYS[2 * n + i]
      redis.call('LPUSH', wake, '1')
      redis.call('LTRIM', wake, 0, 0)
      redis.call('PEXPIRE', wake, ARGV[2])
    end
  end
end
return released
