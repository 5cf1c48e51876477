-- idempotency_claim: take the in-flight claim of an idempotency record, or read what holds it.
-- KEYS[1]  the record key (one key: a pending claim "P ...", then the stored response "D ...")
-- ARGV[1]  the pending value ("P <owner token> <fingerprint>")
-- ARGV[2]  lease in milliseconds (the claim's TTL)
-- Returns  1 when the claim was taken;
--          the value that holds the key when it is one of ours (a claim or a stored response);
--          {0, pttl} when something we did not write holds it (another value or Redis type).
-- A re-sent call finds its own pending value: the caller compares it with ARGV[1].
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if ok and value then
  local kind = string.sub(value, 1, 2)
  if kind == 'P ' or kind == 'D ' then
    return value
  end
end
return {0, redis.call('PTTL', KEYS[1])}
