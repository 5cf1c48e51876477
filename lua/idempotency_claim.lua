-- idempotency_claim: take the in-flight claim of an idempotency record, or read what holds it.
-- KEYS[1]  the record key (one key: a pending claim "P ...", then the stored response "D ...")
-- ARGV[1]  the pending value ("P <owner token> <fingerprint>")
-- ARGV[2]  lease in milliseconds (the claim's TTL)
-- Returns  1 when the claim was taken (the key was free);
--          the value that holds the key when it is one of ours (a claim or a stored response);
--          {0, pttl} when something we did not write holds it (another value or Redis type).
-- GET first, then SET only when the key is free: one atomic script, so this is SET NX, and a
-- replay or a 409 costs the server a GET alone.
-- A re-sent call finds its own pending value: the caller compares it with ARGV[1].
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if ok and not value then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if ok then
  local kind = string.sub(value, 1, 2)
  if kind == 'P ' or kind == 'D ' then
    return value
  end
end
return {0, redis.call('PTTL', KEYS[1])}
