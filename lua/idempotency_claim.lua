-- idempotency_claim: take the in-flight claim of an idempotency record, or read what holds it.
-- KEYS[1]  the record key (one key: a pending claim, then the stored response)
-- ARGV[1]  the pending value ("P <owner token> <fingerprint>")
-- ARGV[2]  lease in milliseconds (the claim's TTL)
-- Returns  {1} when the claim was taken;
--          {0, value, pttl} when the key already exists (a claim or a stored response);
--          {2, error, pttl} when a value of another Redis type holds the key (not ours).
-- A re-sent call finds its own pending value: the caller compares it with ARGV[1].
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if not ok then
  return {2, tostring(value.err or value), redis.call('PTTL', KEYS[1])}
end
return {0, value, redis.call('PTTL', KEYS[1])}
