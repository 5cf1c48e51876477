-- lock_fence_floor: raise fencing counters to at least a floor (quorum mode only).
-- KEYS[1..n] fencing counters (one hash tag)
-- ARGV[1..n] floor of each counter (the fencing token the quorum holder uses),
-- ARGV[n+1] counter TTL in ms
-- Returns the number of counters raised. Idempotent (a max), so a retry does no harm.
-- After a Redlock acquire the holder uses the highest token of its majority and writes it
-- back here, so the next majority (which overlaps this one) issues a higher token.
local n = #KEYS
local raised = 0
for i = 1, n do
  local floor = tonumber(ARGV[i])
  local last = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if last < floor then
    redis.call('SET', KEYS[i], ARGV[i], 'PX', ARGV[n + 1])
    raised = raised + 1
  else
    redis.call('PEXPIRE', KEYS[i], ARGV[n + 1])
  end
end
return raised
