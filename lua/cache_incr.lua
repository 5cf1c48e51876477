-- cache_incr: atomic INCRBY for the cache backend that keeps the key's TTL.
-- KEYS[1] the counter key
-- ARGV[1] delta; ARGV[2] '1' if the key must already exist (Django's incr contract);
-- ARGV[3] TTL in ms for a counter this call creates ('0': none, ALLOW_NO_TTL)
-- Returns the new value, or false when the key is missing and must exist.
-- An INCRBY error (not an integer, or beyond 64 bits) is raised to the caller.
-- Like every INCR, not idempotent: a client that re-sends it after a timeout counts twice
-- (documented in docs/cache.md; the async client this app builds never re-sends on timeout).
local exists = redis.call('EXISTS', KEYS[1])
if exists == 0 and ARGV[2] == '1' then
  return false
end
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
if exists == 0 and tonumber(ARGV[3]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return value
