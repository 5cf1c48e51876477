-- Exact sliding window rate limit: a log of hits (sorted set scored by server time in µs).
-- KEYS[1]: log (sorted set).
-- ARGV[1]: limit; ARGV[2]: window in ms; ARGV[3]: cost (0 = peek, writes nothing);
-- ARGV[4]: request id, unique per hit: it is the member, so hits at equal timestamps never
--          collide and a re-sent call (SPEC D4) finds its member and counts nothing.
-- Returns: {allowed (1/0), limit, remaining, reset_after_ms, retry_after_ms}; reset_after is
-- when the oldest logged hit leaves the window (the next unit of quota returns).
-- Rejected hits are not logged. Trim and PEXPIRE happen in this script: the log holds at
-- most `limit` members and expires one window after its newest hit.
local limit = tonumber(ARGV[1])
local window_us = tonumber(ARGV[2]) * 1000
local cost = tonumber(ARGV[3])
local rid = ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window_us)
local count = redis.call('ZCARD', KEYS[1])

local function until_free(n)
  -- µs until the n-th oldest hit (1-based) leaves the window
  local entry = redis.call('ZRANGE', KEYS[1], n - 1, n - 1, 'WITHSCORES')
  if entry[2] == nil then return 0 end
  return math.max(tonumber(entry[2]) + window_us - now, 0)
end

local function ms(us) return math.ceil(us / 1000) end

if cost > 0 and count + cost <= limit then
  local args = {'NX'}
  for i = 1, cost do
    args[#args + 1] = now
    if i == 1 then args[#args + 1] = rid else args[#args + 1] = rid .. '#' .. i end
  end
  -- NX: a re-sent call finds its members already logged and adds nothing.
  if redis.call('ZADD', KEYS[1], unpack(args)) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    count = count + cost
  end
  return {1, limit, limit - count, ms(until_free(1)), 0}
end

-- A re-sent copy of a hit that was admitted must not now be answered "blocked".
if cost > 0 and redis.call('ZSCORE', KEYS[1], rid) then
  return {1, limit, math.max(limit - count, 0), ms(until_free(1)), 0}
end

local remaining = math.max(limit - count, 0)
if cost == 0 then
  if count < limit then return {1, limit, remaining, ms(until_free(1)), 0} end
  return {0, limit, 0, ms(until_free(1)), math.max(ms(until_free(count - limit + 1)), 1)}
end
local retry = 0
if cost <= limit then retry = until_free(count + cost - limit) end
if cost > limit then retry = window_us end
return {0, limit, remaining, ms(until_free(1)), math.max(ms(retry), 1)}
