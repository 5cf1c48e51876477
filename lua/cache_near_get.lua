-- cache_near_get: a cache value and its remaining lifetime, for the near cache's fill.
-- KEYS[1] the cache key; KEYS[2] its get_or_set metadata (same hash slot).
-- ARGV none.
-- Returns false when the key is missing, else {value, pttl_ms, metadata} (pttl -1: no
-- TTL; metadata false when there is none).
-- Read on a connection with CLIENT TRACKING on: the GET registers the key for an
-- invalidation message, and the PTTL read in the same step bounds the local copy's life.
local value = redis.call('GET', KEYS[1])
if not value then
  return false
end
return {value, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
