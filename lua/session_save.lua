-- session_save: create or update one session and keep its user's index exact, atomically.
-- Returns 1 when saved, 0 when a create collided or an update found no live session
-- (an update never recreates a session deleted meanwhile: no resurrection).
-- KEYS[1]: session data (hash: d=data, c=created ms, a=last activity ms, ip, ua, n=create id).
-- KEYS[2]: the user's index (zset sid -> expiry ms); same hash tag as KEYS[1].
-- ARGV[1]: 'c' create (fails when the key exists) or 'u' update (fails when it does not);
-- ARGV[2]: encoded session data; ARGV[3]: TTL in ms (<= 0: the session expires at once);
-- ARGV[4]: sid (index member); ARGV[5]: '1' index it under KEYS[2], '0' remove it from there;
-- ARGV[6]: create request id (a re-sent create finds its own key and succeeds);
-- ARGV[7]: '1' record activity (a = now) with ARGV[8] ip and ARGV[9] user agent, else '0';
-- ARGV[10]: most sessions the user may have (absent or '0': no cap). When indexing this
-- session leaves more, the user's sessions that expire first (never this one) are ended, at
-- most EVICT_MAX per call. Their data keys are KEYS[1] with another sid: same hash tag, so
-- the same Cluster slot.
local key, idx = KEYS[1], KEYS[2]
local mode, ttl, sid = ARGV[1], tonumber(ARGV[3]), ARGV[4]
if mode == 'c' then
  if redis.call('EXISTS', key) == 1 then
    if redis.pcall('HGET', key, 'n') == ARGV[6] then return 1 end
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
  redis.call('HSET', key, 'd', ARGV[2], 'c', now, 'n', ARGV[6])
else
  redis.call('HSET', key, 'd', ARGV[2])
end
if ARGV[7] == '1' then
  redis.call('HSET', key, 'a', now, 'ip', ARGV[8], 'ua', ARGV[9])
end
redis.call('PEXPIRE', key, ttl)
if ARGV[5] == '1' then
  -- Index scores are expiries, kept within SLACK of the truth: a save that only slides the
  -- expiry by less than that leaves the index alone (one ZSCORE instead of four writes).
  -- So: prune below now - SLACK, and let the index live SLACK past its last member.
  local SLACK = 60000
  local expiry = now + ttl
  local score = tonumber(redis.call('ZSCORE', idx, sid))
  if not score or math.abs(expiry - score) > SLACK then
    redis.call('ZADD', idx, expiry, sid)
    redis.call('ZREMRANGEBYSCORE', idx, '-inf', now - SLACK)
    local cap = tonumber(ARGV[10] or '0') or 0
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
