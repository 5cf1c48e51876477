-- lock_acquire: take every lock in KEYS (all or nothing) and issue one fencing token each.
-- KEYS[1..n]    lock keys ("held"), all with the namespace's hash tag
-- KEYS[n+1..2n] fencing counters of the same names, same hash tag
-- ARGV[1] token (unique per acquisition), ARGV[2] lease in ms,
-- ARGV[3] fencing counter TTL in ms, ARGV[4] owner metadata (JSON, informational)
-- ARGV[5..7] (only from a caller that will wait), see below; then KEYS[2n+1..3n] are the
--         names' waiting markers and KEYS[3n+1..4n] their wake-up lists (same hash tag).
-- Returns {1, fence_1, ..., fence_n} (decimal strings) when every lock is now ours;
--         {0, i, pttl} when KEYS[i] is held by another owner (pttl: its remaining lease).
-- Safe to run twice (no silent duplicate writes): a lock that already holds our token
-- counts as ours, and its fencing token is returned again rather than a new one.
-- Fencing: fence = max(last + 1, server TIME in microseconds), so tokens keep
-- rising after the counter expires or a failover loses the last increment.
-- Waiting: ARGV[5] "someone waits" marker lifetime in ms (a held name's marker is set, so
-- its holder's release pushes a wake-up); ARGV[6] index of the name whose wake-up this
-- waiter consumed (0: none) and ARGV[7] wake-up list TTL in ms: when the attempt fails on
-- another name while that one is free (or handed over) and marked, its wake-up is pushed
-- again (passed on to a waiter of that name alone, who would otherwise stay blocked on a
-- free lock). While handed over ('~') name i may be taken by a waiter that took its
-- wake-up, or by a caller that does not wait (it never queued).
local n = #KEYS / (ARGV[6] and 4 or (ARGV[5] and 3 or 2))
local token = ARGV[1]
local mine = token .. '|'
local held = {}
for i = 1, n do
  local value = redis.call('GET', KEYS[i])
  if value == '~' and (not ARGV[5] or tonumber(ARGV[6] or '0') == i) then
    value = nil -- handed over (see lock_release): to this waiter, or we never queued
  end
  if value then
    if string.sub(value, 1, #mine) ~= mine then
      if ARGV[5] then
        redis.call('SET', KEYS[2 * n + i], '1', 'PX', ARGV[5])
        local k = tonumber(ARGV[6] or '0')
        if k > 0 and k ~= i then
          local other = redis.call('GET', KEYS[k])
          if (not other or other == '~') and redis.call('EXISTS', KEYS[2 * n + k]) == 1 then
            local wake = KEYS[3 * n + k]
            redis.call('LPUSH', wake, '1')
            redis.call('LTRIM', wake, 0, 0)
            redis.call('PEXPIRE', wake, ARGV[7])
          end
        end
      end
      return {0, i, redis.call('PTTL', KEYS[i])}
    end
    held[i] = value
  end
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {1}
for i = 1, n do
  local fence
  if held[i] then
    -- a re-sent acquire: keep the token already issued, renew the lease
    local rest = string.sub(held[i], #mine + 1)
    fence = string.sub(rest, 1, (string.find(rest, '|', 1, true) or (#rest + 1)) - 1)
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    redis.call('PEXPIRE', KEYS[n + i], ARGV[3])
  else
    local last = tonumber(redis.call('GET', KEYS[n + i]) or '0') or 0
    fence = string.format('%.0f', math.max(last + 1, now_us))
    redis.call('SET', KEYS[i], mine .. fence .. '|' .. ARGV[4], 'PX', ARGV[2])
    redis.call('SET', KEYS[n + i], fence, 'PX', ARGV[3])
  end
  out[i + 1] = fence
end
return out
