-- cache_renew: the computing caller extends its short claim while its callable runs.
-- KEYS[1] the cache key (routes the call to its node); KEYS[2] its compute lock
-- ARGV[1] our token; ARGV[2] the claim's lease in ms; ARGV[3] the server's clock (ms)
--         when cache_claim gave us the lock; ARGV[4] the longest the claim may be held,
--         in ms (STAMPEDE_LEASE)
-- Returns 1 extended by ARGV[2] (never past ARGV[3] + ARGV[4]);
--         -1 ARGV[4] has passed since the claim: not extended (it ends, or has ended);
--         0 the lock is not ours any more (its lease ended, or a newer caller holds it).
-- Owner-checked and idempotent: safe to run late or twice.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local left = tonumber(ARGV[3]) + tonumber(ARGV[4]) - now
if left <= 0 then
  return -1
end
local holder = redis.call('GET', KEYS[2])
if not holder or string.sub(holder, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[2], math.min(tonumber(ARGV[2]), left))
return 1
