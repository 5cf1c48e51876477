-- lock_acquire_one: take one lock and issue its fencing token (the one-name case of
-- lock_acquire, with no loops or tables: the uncontended path of every Lock).
-- KEYS[1] lock key ("held"), KEYS[2] its fencing counter (same hash tag)
-- ARGV[1] token (unique per acquisition), ARGV[2] lease in ms,
-- ARGV[3] fencing counter TTL in ms, ARGV[4] owner metadata (JSON, informational)
-- ARGV[5] (only from a caller that will wait) "someone waits" marker lifetime in ms; then
--         KEYS[3] is the name's waiting marker (same hash tag): when the name is held,
--         the marker is set, so the holder's release pushes a wake-up. ARGV[6] "1" when
--         this waiter took a wake-up: it may take a lock handed over ('~', see release),
--         as may a caller that does not wait (no ARGV[5]), which never queued.
-- Returns an integer: the fencing token (> 0) when the lock is now ours;
--         -1 - pttl (<= 0) when another owner holds it (pttl: its remaining lease in ms;
--         0 means it has no TTL, which no key of ours lacks).
-- Safe to run twice (no silent duplicate writes): a lock that already holds our token
-- counts as ours, and its fencing token is returned again rather than a new one.
-- Fencing: fence = max(last + 1, server TIME in microseconds), so tokens keep rising
-- after the counter expires or a failover loses the last increment.
local value = redis.call('GET', KEYS[1])
if value and not (value == '~' and (not ARGV[5] or ARGV[6] == '1')) then
  local mine = ARGV[1] .. '|'
  if string.sub(value, 1, #mine) == mine then
    -- a re-sent acquire: keep the token already issued, renew the lease
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    return tonumber(string.match(value, '^%d+', #mine + 1))
  end
  if ARGV[5] then
    redis.call('SET', KEYS[3], '1', 'PX', ARGV[5])
  end
  return -1 - redis.call('PTTL', KEYS[1])
end
local t = redis.call('TIME')
local fence = t[1] * 1000000 + t[2]
local last = tonumber(redis.call('GET', KEYS[2])) or 0
local text
if fence > last then
  text = t[1] .. string.sub('00000' .. t[2], -6) -- the clock, without number formatting
else
  fence = last + 1
  text = string.format('%.0f', fence)
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. text .. '|' .. ARGV[4], 'PX', ARGV[2])
redis.call('SET', KEYS[2], text, 'PX', ARGV[3])
return fence
