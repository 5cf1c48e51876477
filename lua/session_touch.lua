-- session_touch: record activity on a live session without rewriting its data or its TTL.
-- KEYS[1]: session data (hash).
-- ARGV[1]: ip as stored (truncated, hashed or ''); ARGV[2]: user agent (truncated).
-- Returns 1 when recorded, 0 when the session is gone (a touch never recreates it).
if redis.pcall('HEXISTS', KEYS[1], 'd') ~= 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'a', now, 'ip', ARGV[1], 'ua', ARGV[2])
return 1
