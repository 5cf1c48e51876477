-- cache_claim: decide, in one step, whether this caller computes a cache value.
-- KEYS[1] the cache key; KEYS[2] its compute lock (same hash slot as KEYS[1])
-- ARGV[1] our token (fixed length); ARGV[2] lock lease in ms;
-- ARGV[3] '' after a miss, else the envelope header of the value we saw (refresh of a
--         stale or early-expiring value); ARGV[4] '1' if we will wait for the holder.
-- Returns {1} we hold the lock (also when a retried call finds our own token);
--         {2, value} a value is there now (a miss was filled, or the stale value we saw
--         was refreshed by someone else): use it;
--         {0, holder_token, lock_pttl_ms} another caller computes.
-- A waiter marks the lock ('+' appended) so the holder wakes waiters when it settles.
local value = redis.call('GET', KEYS[1])
if value then
  if ARGV[3] == '' or string.sub(value, 1, #ARGV[3]) ~= ARGV[3] then
    return {2, value}
  end
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
local holder = redis.call('GET', KEYS[2])
local token = string.sub(holder, 1, #ARGV[1])
if token == ARGV[1] then
  return {1}
end
if ARGV[4] == '1' and #holder == #ARGV[1] then
  redis.call('APPEND', KEYS[2], '+')
end
return {0, token, redis.call('PTTL', KEYS[2])}
