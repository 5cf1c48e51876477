-- Fixed window rate limit: one counter per window; the window starts at its first hit.
-- KEYS[1]: counter (string). KEYS[2]: request-id marker (same hash tag; used when ARGV[4] ~= '').
-- ARGV[1]: limit; ARGV[2]: window in ms; ARGV[3]: cost (0 = peek, writes nothing);
-- ARGV[4]: request id (SPEC D4: a re-sent call replays its first answer instead of counting
--          again); ARGV[5]: marker TTL in ms.
-- Returns: {allowed (1/0), limit, remaining, reset_after_ms, retry_after_ms}.
-- Rejected hits are not counted (an increment that overshoots is taken back in this script).
-- The counter's expiry is set in the same script as its first increment (and repaired if it
-- was ever lost), so no counter outlives its window.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local rid = ARGV[4]

local function blocked(count)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl == -1 then redis.call('PEXPIRE', KEYS[1], window) end
  if ttl < 0 then ttl = window end
  local retry = ttl
  if cost > limit then retry = window end
  return {0, limit, math.max(limit - count, 0), ttl, retry}
end

if cost == 0 then
  local count = tonumber(redis.call('GET', KEYS[1]) or '0')
  if count >= limit then return blocked(count) end
  local ttl = 0
  if count > 0 then ttl = math.max(redis.call('PTTL', KEYS[1]), 0) end
  return {1, limit, limit - count, ttl, 0}
end

-- The marker is claimed up front ('1'); a blocked hit rewrites it to '0' below. Only a
-- re-sent call finds it taken, so the common path costs one SET NX.
if rid ~= '' and not redis.call('SET', KEYS[2], '1', 'NX', 'PX', tonumber(ARGV[5])) then
  local count = tonumber(redis.call('GET', KEYS[1]) or '0')
  if redis.call('GET', KEYS[2]) == '0' then return blocked(count) end
  return {1, limit, math.max(limit - count, 0), math.max(redis.call('PTTL', KEYS[1]), 0), 0}
end

local count = redis.call('INCRBY', KEYS[1], cost)
if count > limit then
  if count == cost then
    redis.call('DEL', KEYS[1])
  else
    redis.call('DECRBY', KEYS[1], cost)
  end
  if rid ~= '' then redis.call('SET', KEYS[2], '0', 'PX', tonumber(ARGV[5])) end
  return blocked(count - cost)
end
local ttl = window
if count == cost then
  redis.call('PEXPIRE', KEYS[1], window)
else
  ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then
    redis.call('PEXPIRE', KEYS[1], window)
    ttl = window
  end
end
return {1, limit, limit - count, ttl, 0}
