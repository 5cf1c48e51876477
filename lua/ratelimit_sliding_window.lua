-- Exact sliding window rate limit: a log of hits (sorted set scored by server time in µs).
-- KEYS[1]: log (sorted set).
-- ARGV[1]: limit; ARGV[2]: window in ms; ARGV[3]: cost (0 = peek, writes nothing);
-- ARGV[4]: request id, unique per hit: it is the member, so hits at equal timestamps never
--          collide and a re-sent call finds its member and counts nothing.
-- Returns: one string "<allowed 1|0> <remaining> <reset_after_ms> <retry_after_ms>";
-- reset_after is when the oldest logged hit leaves the window (the next unit of quota
-- returns).
-- Rejected hits are not logged. Trim and PEXPIRE happen in this script: the log holds at
-- most `limit` members and expires one window after its newest hit. A hit of cost n logs n
-- members (rid, rid#2 .. rid#n), added in chunks so that any cost up to the limit fits
-- Lua's argument stack.
local limit = tonumber(ARGV[1])
local window_us = tonumber(ARGV[2]) * 1000
local cost = tonumber(ARGV[3])
local rid = ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cutoff = now - window_us

-- Trim only when the oldest hit has left the window (most calls have nothing to trim).
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if oldest[2] ~= nil and tonumber(oldest[2]) <= cutoff then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
  oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
end
local count = 0
if oldest[2] ~= nil then count = redis.call('ZCARD', KEYS[1]) end

local function ms(us) return math.ceil(us / 1000) end

local function reset_after()
  -- µs until the oldest logged hit leaves the window
  if oldest[2] == nil then return 0 end
  return math.max(tonumber(oldest[2]) + window_us - now, 0)
end

local function until_free(n)
  -- µs until the n-th oldest hit (1-based) leaves the window
  local entry = redis.call('ZRANGE', KEYS[1], n - 1, n - 1, 'WITHSCORES')
  if entry[2] == nil then return 0 end
  return math.max(tonumber(entry[2]) + window_us - now, 0)
end

local function add(n)
  -- NX: a re-sent call finds its members already logged and adds nothing.
  if n == 1 then return redis.call('ZADD', KEYS[1], 'NX', now, rid) end
  local added, first = 0, 1
  while first <= n do
    local args = {'NX'}
    for i = first, math.min(first + 999, n) do
      args[#args + 1] = now
      if i == 1 then args[#args + 1] = rid else args[#args + 1] = rid .. '#' .. i end
    end
    local got = redis.call('ZADD', KEYS[1], unpack(args))
    if got == 0 and first == 1 then return 0 end
    added = added + got
    first = first + 1000
  end
  return added
end

if cost > 0 and count + cost <= limit then
  if add(cost) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    count = count + cost
    if oldest[2] == nil then oldest = {rid, now} end
  end
  return '1 ' .. (limit - count) .. ' ' .. ms(reset_after()) .. ' 0'
end

-- A re-sent copy of a hit that was admitted must not now be answered "blocked".
if cost > 0 and redis.call('ZSCORE', KEYS[1], rid) then
  return '1 ' .. math.max(limit - count, 0) .. ' ' .. ms(reset_after()) .. ' 0'
end

local remaining = math.max(limit - count, 0)
if cost == 0 then
  if count < limit then return '1 ' .. remaining .. ' ' .. ms(reset_after()) .. ' 0' end
  return '0 0 ' .. ms(reset_after()) .. ' ' .. math.max(ms(until_free(count - limit + 1)), 1)
end
local retry = window_us
if cost <= limit then retry = until_free(count + cost - limit) end
return '0 ' .. remaining .. ' ' .. ms(reset_after()) .. ' ' .. math.max(ms(retry), 1)
