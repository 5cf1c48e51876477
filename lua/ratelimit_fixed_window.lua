-- Fixed window rate limit: one counter per window; the window starts at its first hit.
-- KEYS[1]: counter (string). KEYS[2]: request-id marker (same hash tag; used when ARGV[4] ~= '').
-- ARGV[1]: limit; ARGV[2]: window in ms; ARGV[3]: cost (0 = peek, writes nothing);
-- ARGV[4]: request id (SPEC D4: a re-sent call replays its first answer instead of counting
--          again); ARGV[5]: marker TTL in ms.
-- Returns: {allowed (1/0), limit, remaining, reset_after_ms, retry_after_ms}.
-- Rejected hits are not counted. The counter's expiry is set in the same script as its first
-- increment (and repaired if it was ever lost), so no counter outlives its window.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local rid = ARGV[4]

local function state(allowed)
  local count = tonumber(redis.call('GET', KEYS[1]) or '0')
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then ttl = window end
  if count == 0 then ttl = 0 end
  local remaining = math.max(limit - count, 0)
  local retry = 0
  if allowed == 0 then
    retry = ttl
    if retry <= 0 or cost > limit then retry = window end
  end
  return {allowed, limit, remaining, ttl, retry}
end

if cost > 0 and rid ~= '' then
  local seen = redis.call('GET', KEYS[2])
  if seen then return state(tonumber(seen)) end
end

local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local allowed = 0
if cost > 0 and count + cost <= limit then
  allowed = 1
  count = redis.call('INCRBY', KEYS[1], cost)
  if count == cost or redis.call('PTTL', KEYS[1]) < 0 then
    redis.call('PEXPIRE', KEYS[1], window)
  end
elseif cost == 0 and count < limit then
  allowed = 1
end
if cost > 0 and rid ~= '' then
  redis.call('SET', KEYS[2], allowed, 'PX', tonumber(ARGV[5]))
end
return state(allowed)
