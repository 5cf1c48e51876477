-- lock_release_one: delete one lock if it still holds our token (the one-name case of
-- lock_release, with no loops).
-- KEYS[1] lock key
-- ARGV[1] token of the acquisition being released
-- ARGV[2] (optional) wake-up list TTL in ms, ARGV[3] hand-over window in ms; then KEYS[2]
--         is the name's waiting marker and KEYS[3] its wake-up list (same hash tag). When
--         the marker says someone waits, one element is pushed onto the list (kept at one
--         element): exactly one blocked waiter wakes, or the next one to block returns at
--         once (the list lives ARGV[2] ms); and the lock is handed over: its value becomes
--         '~' for ARGV[3] ms, which among waiters only one that took a wake-up may acquire,
--         so a waiting newcomer (or this releaser again) cannot overtake the one just woken.
-- Returns 1 when the lock was ours and is now released, else 0 (left alone).
-- The fencing counter is kept: tokens must keep rising for the next holder.
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
  return 0
end
if ARGV[2] and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('SET', KEYS[1], '~', 'PX', ARGV[3])
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('LTRIM', KEYS[3], 0, 0)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
return 1
