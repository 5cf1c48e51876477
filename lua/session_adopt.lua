-- session_adopt: record a session held by the previous session engine in this store.
-- KEYS[1]: the session's data hash (as in session_save: d, c, v, m); named <...>:s:<sid>,
-- the sid (the index member) is the part after its last ':'.
-- KEYS[2]: the user's index (zset sid -> expiry ms); same hash tag as KEYS[1].
-- ARGV[1]: 'm' mirror (the previous engine still holds the session: overwrite the copy,
-- mark it m=1) or 'v' move (this store holds it from now on: unless KEYS[1] already holds a
-- moved copy, write it without the mark);
-- ARGV[2]: encoded session data; ARGV[3]: TTL in ms (> 0); ARGV[4]: '1' index it under
-- KEYS[2], '0' do not.
-- Returns 1 when written, or the data of the moved copy already there (a move repeated by
-- a concurrent request or a retry keeps what was written since: nothing is lost).
local key, idx = KEYS[1], KEYS[2]
local mode, ttl = ARGV[1], tonumber(ARGV[3])
if mode == 'v' and redis.pcall('HEXISTS', key, 'd') == 1 and
    redis.pcall('HEXISTS', key, 'm') == 0 then
  return redis.call('HGET', key, 'd')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('TYPE', key).ok ~= 'hash' then redis.call('DEL', key) end
if redis.call('HEXISTS', key, 'c') == 0 then redis.call('HSET', key, 'c', now) end
redis.call('HSET', key, 'd', ARGV[2], 'v', '1')
if mode == 'm' then redis.call('HSET', key, 'm', '1') else redis.call('HDEL', key, 'm') end
redis.call('PEXPIRE', key, ttl)
if ARGV[4] == '1' then
  local SLACK = 60000
  local sid = string.match(key, '[^:]*$')
  redis.call('ZADD', idx, now + ttl, sid)
  redis.call('ZREMRANGEBYSCORE', idx, '-inf', now - SLACK)
  local last = redis.call('ZRANGE', idx, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', idx, tonumber(last[2]) + SLACK)
end
return 1
