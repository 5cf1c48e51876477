-- audit_batch: read-only TTL and memory probe of one SCAN batch (redis_audit).
-- KEYS: the keys of one SCAN batch (any slots: only run on a non-cluster server).
-- ARGV[1]: sample stride N: measure MEMORY USAGE of one key in N (0 = none).
-- ARGV[2]: index of KEYS[1] in the whole scan (so sampling continues across batches).
-- Returns: a flat array, two integers per key in KEYS order: PTTL (-1 no TTL, -2 gone),
--          then MEMORY USAGE in bytes, or -1 when not measured or gone.
-- Writes nothing, so it is safe to run twice and adds no keys (no silent duplicate writes).
local stride = tonumber(ARGV[1])
local offset = tonumber(ARGV[2])
local out = {}
for i, key in ipairs(KEYS) do
  out[#out + 1] = redis.call('PTTL', key)
  local size = -1
  if stride > 0 and (offset + i - 1) % stride == 0 then
    size = redis.call('MEMORY', 'USAGE', key) or -1
  end
  out[#out + 1] = size
end
return out
