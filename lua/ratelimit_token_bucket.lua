-- Token bucket as GCRA: one key holding the theoretical arrival time (TAT, server µs).
-- KEYS[1]: TAT (string).
-- ARGV[1]: rate count; ARGV[2]: period in ms (refill: count per period, steadily);
-- ARGV[3]: burst (bucket size, >= 1); ARGV[4]: cost (absent = 1; 0 = peek, writes nothing).
-- Returns, when admitted: one integer, reset_after_ms * (burst + 1) + remaining (the
-- caller knows the burst; one integer reply is the cheapest to build, send and parse), or
-- the string below when that product would not be exact in a Lua number.
-- Otherwise one string "<allowed 1|0> <remaining> <reset_after_ms> <retry_after_ms>".
-- reset_after is when the next token arrives (0 when the bucket is full), so a blocked
-- answer's retry_after is never earlier than its reset_after.
-- Rejected hits consume nothing. The key expires when the bucket is full again, which is
-- exactly when a missing key means the same thing as the stored one.
-- Not idempotent: callers run it on a client that never re-sends a call.
-- Three commands (TIME, GET, SET) and no helper closures: this runs on every request.
local interval = tonumber(ARGV[2]) * 1000 / tonumber(ARGV[1])  -- µs per token
local burst = tonumber(ARGV[3])
local cost = 1
if ARGV[4] then cost = tonumber(ARGV[4]) end
local tolerance = interval * burst                              -- how far TAT may run ahead
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end

-- Half a µs of slack absorbs float rounding of a fractional interval.
local allowed, retry = 1, 0
if cost == 0 then
  local wait = tat + interval - tolerance - now
  if wait > 0.5 then allowed, retry = 0, math.max(wait, 1000) end
else
  local new_tat = tat + interval * cost
  local wait = new_tat - tolerance - now
  if wait <= 0.5 then
    tat = new_tat
    redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX',
               math.max(math.ceil((new_tat - now) / 1000), 1))
  elseif cost > burst then
    allowed, retry = 0, tonumber(ARGV[2]) * 1000  -- never admitted: a full period
  else
    allowed, retry = 0, math.max(wait, 1000)
  end
end

local ahead = tat - now
local remaining = math.floor((tolerance - ahead + 0.5) / interval)
if remaining > burst then remaining = burst elseif remaining < 0 then remaining = 0 end
local next_token = 0
if remaining < burst then
  next_token = ahead + (remaining + 1) * interval - tolerance
  if next_token < 0 then next_token = 0 end
end
local reset = math.ceil(next_token / 1000)
-- 2^53: the largest exact integer of a Lua number
if allowed == 1 and (reset + 1) * (burst + 1) < 9007199254740992 then
  return reset * (burst + 1) + remaining
end
return allowed .. ' ' .. remaining .. ' ' .. reset .. ' ' .. math.ceil(retry / 1000)
