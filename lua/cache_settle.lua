-- cache_settle: the computing caller stores its value (or gives up) and wakes waiters.
-- KEYS[1] the cache key; KEYS[2] its compute lock; KEYS[3] the wake-up list of our token
--         (all three in one hash slot)
-- ARGV[1] our token; ARGV[2] '1' to store ARGV[3], '0' to only release (the compute
--         raised); ARGV[3] the value; ARGV[4] its TTL in ms ('0': none); ARGV[5] wake list TTL in ms
-- Returns 1 if the lock was still ours (and is now released), else 0. The value is stored
-- either way: it is fresh, and a newer holder's write would only replace it.
-- Safe to run twice (a client retry): SET and an owner-checked DEL are idempotent.
if ARGV[2] == '1' then
  if ARGV[4] == '0' then
    redis.call('SET', KEYS[1], ARGV[3])  -- timeout=None with OPTIONS ALLOW_NO_TTL only
  else
    redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  end
end
local holder = redis.call('GET', KEYS[2])
if not holder or string.sub(holder, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
if #holder > #ARGV[1] then
  -- Waiters block on BLMOVE list list: one element wakes all of them, and the list
  -- disappears with its TTL.
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return 1
