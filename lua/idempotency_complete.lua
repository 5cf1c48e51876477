-- idempotency_complete: replace our pending claim with the stored response, owner-checked.
-- KEYS[1]  the record key
-- ARGV[1]  our pending value (the exact value the claim wrote: owner token + fingerprint)
-- ARGV[2]  the stored response record
-- ARGV[3]  retention TTL in milliseconds
-- Returns  1 when stored (or already stored by an earlier send of this very call);
--          0 when the claim is no longer ours (its lease ended or an operator deleted it).
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if current == ARGV[2] then
  return 1
end
return 0
