-- session_save: create or update one session and keep its user's index exact, atomically.
-- Returns 1 when saved, 0 when a create collided or an update found no live session
-- (an update never recreates a session deleted meanwhile: no resurrection).
-- KEYS[1]: session data (hash: d=data, c=created ms, a=last activity ms, ip, ua, n=create id,
-- v=format version, written on create: 1),
-- named <...>:s:<sid>; the sid (the index member) is the part after its last ':'.
-- KEYS[2]: the user's index (zset sid -> expiry ms); same hash tag as KEYS[1].
-- ARGV[1]: flags: 'c' create (fails when the key exists) or 'u' update (fails when it does
-- not), then '1' index it under KEYS[2] or '0' remove it from there, then 'a' when activity
-- is recorded (a = now, with an ip and a user agent below);
-- ARGV[2]: encoded session data; ARGV[3]: TTL in ms (<= 0: the session expires at once);
-- ARGV[4]: most sessions the user may have ('0': no cap). When indexing this session leaves
-- more, the user's sessions that expire first (never this one) are ended, at most EVICT_MAX
-- per call. Their data keys are KEYS[1] with another sid: same hash tag, same Cluster slot.
-- Then, only when they apply: the create request id (a re-sent create finds its own key and
-- succeeds), then the ip and the user agent of the activity.
-- Fewer arguments are fewer bytes for the client to pack on every save.
local key, idx = KEYS[1], KEYS[2]
local flags, ttl = ARGV[1], tonumber(ARGV[3])
local mode, indexed = string.sub(flags, 1, 1), string.sub(flags, 2, 2) == '1'
local sid = string.match(key, '[^:]*$')
local nid, at = nil, 5
if mode == 'c' then nid, at = ARGV[5], 6 end
if mode == 'c' then
  if redis.call('EXISTS', key) == 1 then
    if redis.pcall('HGET', key, 'n') == nid then return 1 end
    return 0
  end
elseif redis.pcall('HEXISTS', key, 'd') ~= 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ttl <= 0 then
  redis.call('DEL', key)
  redis.call('ZREM', idx, sid)
  return 1
end
if mode == 'c' then
  redis.call('HSET', key, 'd', ARGV[2], 'c', now, 'n', nid, 'v', '1')
else
  redis.call('HSET', key, 'd', ARGV[2])
end
if string.sub(flags, 3, 3) == 'a' then
  redis.call('HSET', key, 'a', now, 'ip', ARGV[at], 'ua', ARGV[at + 1])
end
redis.call('PEXPIRE', key, ttl)
if indexed then
  -- Index scores are expiries, kept within SLACK of the truth: a save that only slides the
  -- expiry by less than that leaves the index alone (one ZSCORE instead of four writes).
  -- So: prune below now - SLACK, and let the index live SLACK past its last member.
  local SLACK = 60000
  local expiry = now + ttl
  local score = tonumber(redis.call('ZSCORE', idx, sid))
  if not score or math.abs(expiry - score) > SLACK then
    redis.call('ZADD', idx, expiry, sid)
    redis.call('ZREMRANGEBYSCORE', idx, '-inf', now - SLACK)
    local cap = tonumber(ARGV[4]) or 0
    if cap > 0 then
      local EVICT_MAX = 100
      local excess = math.min(redis.call('ZCARD', idx) - cap, EVICT_MAX)
      if excess > 0 then
        local base = string.sub(key, 1, #key - #sid)
        for _, old in ipairs(redis.call('ZRANGE', idx, 0, excess)) do
          if excess > 0 and old ~= sid then
            redis.call('DEL', base .. old)
            redis.call('ZREM', idx, old)
            excess = excess - 1
          end
        end
      end
    end
    local last = redis.call('ZRANGE', idx, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', idx, tonumber(last[2]) + SLACK)
  end
else
  redis.call('ZREM', idx, sid)
end
return 1
