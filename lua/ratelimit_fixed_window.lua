-- Fixed window rate limit: one counter per window; the window starts at its first hit.
-- KEYS[1]: counter (string).
-- ARGV[1]: limit; ARGV[2]: window in ms; ARGV[3]: cost (absent = 1; 0 = peek, writes
-- nothing).
-- Returns, when admitted: one integer, reset_after_ms * (limit + 1) + remaining (the
-- caller knows the limit; one integer reply is the cheapest to build, send and parse), or
-- the string below when that product would not be exact in a Lua number.
-- Otherwise one string "<allowed 1|0> <remaining> <reset_after_ms> <retry_after_ms>".
-- reset_after is when the window ends (the quota comes back).
-- Rejected hits are not counted (an increment that overshoots is taken back in this script).
-- The counter's expiry is set in the same script as its first increment (and repaired if it
-- was ever lost), so no counter outlives its window.
-- Not idempotent: callers run it on a client that never re-sends a call.
-- An admitted hit of cost 1 runs two commands: INCR, then PTTL, or, on the window's first
-- hit (INCR answered 1: no counter existed, since no path leaves one at 0), PEXPIRE.
local limit = tonumber(ARGV[1])
local count, ttl
if not ARGV[3] then  -- cost 1, the common case, inline
  count = redis.call('INCR', KEYS[1])
  if count <= limit then
    ttl = -1
    if count > 1 then ttl = redis.call('PTTL', KEYS[1]) end
    if ttl < 0 then  -- the window's first hit (or an expiry that was lost)
      ttl = tonumber(ARGV[2])
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    -- 2^53: the largest exact integer of a Lua number
    if (ttl + 1) * (limit + 1) < 9007199254740992 then return ttl * (limit + 1) + limit - count end
    return '1 ' .. (limit - count) .. ' ' .. ttl .. ' 0'
  end
end

local function admitted()
  if (ttl + 1) * (limit + 1) < 9007199254740992 then return ttl * (limit + 1) + limit - count end
  return '1 ' .. (limit - count) .. ' ' .. ttl .. ' 0'
end

local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3] or '1')
if count == nil then
  if cost == 0 then
    count = tonumber(redis.call('GET', KEYS[1]) or '0')
    if count < limit then
      ttl = 0
      if count > 0 then ttl = math.max(redis.call('PTTL', KEYS[1]), 0) end
      return admitted()
    end
  else
    count = redis.call('INCRBY', KEYS[1], cost)
    if count <= limit then
      if count == cost then
        ttl = window
        redis.call('PEXPIRE', KEYS[1], window)
      else
        ttl = redis.call('PTTL', KEYS[1])
        if ttl < 0 then
          ttl = window
          redis.call('PEXPIRE', KEYS[1], window)
        end
      end
      return admitted()
    end
  end
end
if cost > 0 then
  -- Over the limit: take the increment back (or drop a counter this hit created).
  if count == cost then redis.call('DEL', KEYS[1]) else redis.call('DECRBY', KEYS[1], cost) end
  count = count - cost
end
-- Blocked: retry when the window ends; a cost above the limit never fits (a full window).
ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then redis.call('PEXPIRE', KEYS[1], window) end
if ttl < 0 then ttl = window end
local retry = ttl
if cost > limit then retry = window end
return '0 ' .. math.max(limit - count, 0) .. ' ' .. ttl .. ' ' .. retry
