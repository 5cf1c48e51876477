-- Token bucket as GCRA: one key holding the theoretical arrival time (TAT, server µs).
-- KEYS[1]: TAT (string).
-- ARGV[1]: rate count; ARGV[2]: period in ms (refill: count per period, steadily);
-- ARGV[3]: burst (bucket size, >= 1); ARGV[4]: cost (0 = peek, writes nothing).
-- Returns: one string "<allowed 1|0> <remaining> <reset_after_ms> <retry_after_ms>";
-- reset_after is when the next token arrives (0 when the bucket is full), so a blocked
-- answer's retry_after is never earlier than its reset_after.
-- Rejected hits consume nothing. The key expires when the bucket is full again, which is
-- exactly when a missing key means the same thing as the stored one.
-- Not idempotent: callers run it on a client that never re-sends a call.
local count = tonumber(ARGV[1])
local period_us = tonumber(ARGV[2]) * 1000
local burst = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = period_us / count          -- µs per token
local tolerance = interval * burst          -- how far TAT may run ahead of now

local function ms(us) return math.ceil(us / 1000) end

local function report(allowed, tat, retry_us)
  local ahead = math.max(tat - now, 0)
  -- Half a µs of slack absorbs float rounding of a fractional interval.
  local remaining = math.floor((tolerance - ahead + 0.5) / interval)
  remaining = math.min(math.max(remaining, 0), burst)
  local next_token = 0
  if remaining < burst then
    next_token = math.max(ahead + (remaining + 1) * interval - tolerance, 0)
  end
  return allowed .. ' ' .. remaining .. ' ' .. ms(next_token) .. ' ' .. ms(retry_us)
end

local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end

if cost == 0 then
  local wait = tat + interval - tolerance - now
  if wait <= 0.5 then return report(1, tat, 0) end
  return report(0, tat, math.max(wait, 1000))
end

local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance
if allow_at - now <= 0.5 then
  redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX', math.max(ms(new_tat - now), 1))
  return report(1, new_tat, 0)
end
if cost > burst then return report(0, tat, period_us) end
return report(0, tat, math.max(allow_at - now, 1000))
