-- Token bucket as GCRA: one key holding the theoretical arrival time (TAT, server µs).
-- KEYS[1]: TAT (string).
-- ARGV[1]: rate count; ARGV[2]: period in ms (refill: count per period, steadily);
-- ARGV[3]: burst (bucket size, >= 1); ARGV[4]: cost (0 = peek, writes nothing).
-- Returns: {allowed (1/0), burst, remaining, reset_after_ms, retry_after_ms}; reset_after is
-- when the bucket is full again.
-- Rejected hits consume nothing. The key expires when the bucket is full again, which is
-- exactly when a missing key means the same thing as the stored one.
-- Not idempotent: callers run it on a client that never re-sends a call (SPEC D4).
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
  local remaining = math.floor((tolerance - ahead + 0.5) / interval)
  remaining = math.min(math.max(remaining, 0), burst)
  return {allowed, burst, remaining, ms(ahead), ms(retry_us)}
end

local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end

-- Half a µs of slack absorbs float rounding of a fractional interval.
if cost == 0 then
  local wait = tat + interval - tolerance - now
  if wait <= 0.5 then return report(1, tat, 0) end
  return report(0, tat, math.max(wait, 1000))
end

local new_tat = tat + interval * cost
local allow_at = new_tat - tolerance
local allowed = 0
local retry = 0
if allow_at - now <= 0.5 then
  allowed = 1
  tat = new_tat
  redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX', math.max(ms(new_tat - now), 1))
elseif cost > burst then
  retry = period_us
else
  retry = math.max(allow_at - now, 1000)
end
return report(allowed, tat, retry)
