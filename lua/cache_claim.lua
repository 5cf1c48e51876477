-- cache_claim: decide, in one step, whether this caller computes a cache value.
-- KEYS[1] the cache key; KEYS[2] its compute lock; KEYS[3] its metadata (all three in
--         the same hash slot)
-- ARGV[1] our token (fixed length); ARGV[2] the claim's lease in ms (short: the computing
--         caller extends it with cache_renew while it computes);
-- ARGV[3] '' after a miss, else what identifies the value we saw (refresh of a stale or
--         early-expiring value): its metadata record, or the header of an envelope
--         written by 0.1.0; ARGV[4] '1' if we will wait for the holder.
-- Returns {1, now} we hold the lock (also when a retried call finds our own token);
--         {2, now, value, metadata} a value is there now (a miss was filled, or the
--         stale value we saw was refreshed by someone else): use it;
--         {0, now, holder_token, lock_pttl_ms} another caller computes.
-- now is the server's clock in ms (TIME). The computing caller hands it to cache_renew
-- (a claim is never held longer than STAMPEDE_LEASE from it) and to cache_settle (a
-- value's lifetime counts from its computation, not from when the store arrives).
-- A waiter marks the lock ('+' appended) so the holder wakes waiters when it settles.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local value = redis.call('GET', KEYS[1])
if value then
  local metadata = redis.call('GET', KEYS[3])
  if ARGV[3] == '' or (metadata ~= ARGV[3] and string.sub(value, 1, #ARGV[3]) ~= ARGV[3]) then
    return {2, now, value, metadata}
  end
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, now}
end
local holder = redis.call('GET', KEYS[2])
local token = string.sub(holder, 1, #ARGV[1])
if token == ARGV[1] then
  return {1, now}
end
if ARGV[4] == '1' and #holder == #ARGV[1] then
  redis.call('APPEND', KEYS[2], '+')
end
return {0, now, token, redis.call('PTTL', KEYS[2])}
