-- Exact sliding window rate limit: a log of hits (sorted set scored by server time in µs).
-- KEYS[1]: log (sorted set).
-- ARGV[1]: limit; ARGV[2]: window in ms;
-- ARGV[3]: request id, unique per hit: it is the member, so hits at equal timestamps never
--          collide and a re-sent call finds its member and counts nothing;
-- ARGV[4]: cost (absent = 1; 0 = peek, writes nothing).
-- Returns, when admitted: one integer, reset_after_ms * (limit + 1) + remaining (the
-- caller knows the limit; one integer reply is the cheapest to build, send and parse), or
-- the string below when that product would not be exact in a Lua number.
-- Otherwise one string "<allowed 1|0> <remaining> <reset_after_ms> <retry_after_ms>".
-- reset_after is when the oldest logged hit leaves the window (the next unit of quota
-- returns).
-- Rejected hits are not logged. Trim and PEXPIRE happen in this script: the log holds at
-- most `limit` members and expires one window after its newest hit. A hit of cost n logs n
-- members (rid, rid#2 .. rid#n), added in chunks so that any cost up to the limit fits
-- Lua's argument stack.
-- An admitted hit runs five commands (TIME, ZRANGE, ZCARD, ZADD, PEXPIRE): the trim runs
-- only when the oldest hit has left the window, which most calls can tell from ZRANGE.
local limit = tonumber(ARGV[1])
local window_us = ARGV[2] * 1000
local rid = ARGV[3]
local base = limit + 1
-- 2^53: the largest exact integer of a Lua number (a reset is at most one window)
local packed = (window_us / 1000 + 2) * base < 9007199254740992
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
-- The same µs as a string for ZADD: a Lua number passed to redis.call is formatted with
-- "%.17g" on every call, which costs more than this concatenation.
local now_s = t[1] .. string.sub('00000' .. t[2], -6)

local oldest = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')[2]
if oldest and oldest + window_us <= now then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window_us)
  oldest = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')[2]
end
local count = 0
if oldest then count = redis.call('ZCARD', KEYS[1]) end

if not ARGV[4] and count < limit then  -- cost 1, the common case, inline
  -- NX: a re-sent call finds its member already logged and adds nothing.
  if redis.call('ZADD', KEYS[1], 'NX', now_s, rid) == 1 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    count = count + 1
  end
  local reset = window_us
  if oldest then reset = oldest + window_us - now end
  if packed then return math.ceil(reset / 1000) * base + limit - count end
  return '1 ' .. (limit - count) .. ' ' .. math.ceil(reset / 1000) .. ' 0'
end

local cost = tonumber(ARGV[4] or '1')

local function reset_after()
  -- ms until the oldest logged hit leaves the window
  if not oldest then return 0 end
  return math.ceil(math.max(oldest + window_us - now, 0) / 1000)
end

local function admitted(remaining)
  if packed then return reset_after() * base + remaining end
  return '1 ' .. remaining .. ' ' .. reset_after() .. ' 0'
end

local function until_free(n)
  -- ms until the n-th oldest hit (1-based) leaves the window
  local score = redis.call('ZRANGE', KEYS[1], n - 1, n - 1, 'WITHSCORES')[2]
  if not score then return 0 end
  return math.ceil(math.max(score + window_us - now, 0) / 1000)
end

if cost > 0 and count + cost <= limit then
  local added, first = 0, 1
  while first <= cost do
    local args = {'NX'}
    for i = first, math.min(first + 999, cost) do
      args[#args + 1] = now
      if i == 1 then args[#args + 1] = rid else args[#args + 1] = rid .. '#' .. i end
    end
    local got = redis.call('ZADD', KEYS[1], unpack(args))
    if got == 0 and first == 1 then break end  -- a re-sent call: already logged
    added = added + got
    first = first + 1000
  end
  if added > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    count = count + added
    if not oldest then oldest = now end
  end
  return admitted(limit - count)
end

-- A re-sent copy of a hit that was admitted must not now be answered "blocked".
if cost > 0 and redis.call('ZSCORE', KEYS[1], rid) then
  return admitted(math.max(limit - count, 0))
end

local remaining = math.max(limit - count, 0)
if cost == 0 then
  if count < limit then return admitted(remaining) end
  return '0 0 ' .. reset_after() .. ' ' .. math.max(until_free(count - limit + 1), 1)
end
local retry = ARGV[2]
if cost <= limit then retry = until_free(count + cost - limit) end
return '0 ' .. remaining .. ' ' .. reset_after() .. ' ' .. math.max(retry, 1)
