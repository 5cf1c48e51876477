-- idempotency_extend: renew the lease of our pending claim while a long view runs.
-- KEYS[1]  the record key
-- ARGV[1]  our pending value (owner token + fingerprint)
-- ARGV[2]  the new lease in milliseconds, counted from now
-- Returns  1 when renewed; 0 when the claim is no longer ours (lease ended, or replaced).
-- Idempotent: a re-sent call sets the same lease again.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
