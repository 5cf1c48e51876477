-- cache_settle: the computing caller stores its value (or gives up) and wakes waiters.
-- KEYS[1] the cache key; KEYS[2] its compute lock; KEYS[3] the wake-up list of our token;
--         KEYS[4] the cache key's metadata (all four in one hash slot)
-- ARGV[1] our token; ARGV[2] '1' to store ARGV[3], '0' to only release (the compute
--         raised); ARGV[3] the value; ARGV[4] its lifetime in ms counted from when it was
--         computed ('0': none); ARGV[5] wake list TTL in ms; ARGV[6] the server's clock
--         (ms) in the claim's reply before the computation; ARGV[7] ms the caller spent
--         from that reply to sending this call; ARGV[8] the value's metadata record
--         (stored beside it with the same lifetime).
-- Returns 1 if the lock was still ours (and is now released), else 0. The value is stored
-- either way (it is fresh; a newer holder's write would only replace it), for what is
-- left of its lifetime: it was computed by ARGV[6] + ARGV[7] on the server's clock, so
-- a store that arrives later (it waited in a hung server's socket) is shortened, or not
-- stored once the lifetime is over. A value never lives past its timeout (plus
-- STALE_TTL) counted from its computation.
-- Safe to run twice (a client retry): SET and an owner-checked DEL are idempotent.
if ARGV[2] == '1' then
  if ARGV[4] == '0' then
    redis.call('SET', KEYS[1], ARGV[3])  -- timeout=None with OPTIONS ALLOW_NO_TTL only
    redis.call('SET', KEYS[4], ARGV[8])
  else
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local late = now - (tonumber(ARGV[6]) + tonumber(ARGV[7]))
    if late < 0 then
      late = 0
    end
    local left = tonumber(ARGV[4]) - late
    if left > 0 then
      redis.call('SET', KEYS[1], ARGV[3], 'PX', left)
      redis.call('SET', KEYS[4], ARGV[8], 'PX', left)
    end
  end
end
local holder = redis.call('GET', KEYS[2])
if not holder or string.sub(holder, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
if #holder > #ARGV[1] then
  -- Waiters block on BLMOVE list list: one element wakes all of them, and the list
  -- disappears with its TTL.
  redis.call('LPUSH', KEYS[3], '1')
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end
return 1
