-- Fixed window rate limit: one counter per window; the window starts at its first hit.
-- KEYS[1]: counter (string).
-- ARGV[1]: limit; ARGV[2]: window in ms; ARGV[3]: cost (0 = peek, writes nothing).
-- Returns: one string "<allowed 1|0> <remaining> <reset_after_ms> <retry_after_ms>";
-- reset_after is when the window ends (the quota comes back).
-- Rejected hits are not counted (an increment that overshoots is taken back in this script).
-- The counter's expiry is set in the same script as its first increment (and repaired if it
-- was ever lost), so no counter outlives its window.
-- Not idempotent: callers run it on a client that never re-sends a call.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local function blocked(count)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl == -1 then redis.call('PEXPIRE', KEYS[1], window) end
  if ttl < 0 then ttl = window end
  local retry = ttl
  if cost > limit then retry = window end
  return '0 ' .. math.max(limit - count, 0) .. ' ' .. ttl .. ' ' .. retry
end

if cost == 0 then
  local count = tonumber(redis.call('GET', KEYS[1]) or '0')
  if count >= limit then return blocked(count) end
  local ttl = 0
  if count > 0 then ttl = math.max(redis.call('PTTL', KEYS[1]), 0) end
  return '1 ' .. (limit - count) .. ' ' .. ttl .. ' 0'
end

local count = redis.call('INCRBY', KEYS[1], cost)
if count == cost then
  if count > limit then
    redis.call('DEL', KEYS[1])
    return blocked(0)
  end
  redis.call('PEXPIRE', KEYS[1], window)
  return '1 ' .. (limit - count) .. ' ' .. window .. ' 0'
end
if count > limit then
  redis.call('DECRBY', KEYS[1], cost)
  return blocked(count - cost)
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], window)
  ttl = window
end
return '1 ' .. (limit - count) .. ' ' .. ttl .. ' 0'
