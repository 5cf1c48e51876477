-- session_delete: delete one session and its index entry (idempotent).
-- KEYS[1]: session data; KEYS[2]: the index of the user the key is tagged with (same tag).
-- ARGV[1]: sid (index member); ARGV[2]: '' or a request id: then a short-lived tombstone
-- (field x, 60 s TTL) is left so that a re-sent call (no silent duplicate writes) still reports the deletion.
-- Returns 1 when a live session was deleted (or this request id already deleted it), else 0.
local live = redis.pcall('HEXISTS', KEYS[1], 'd') == 1
if not live and ARGV[2] ~= '' and redis.pcall('HGET', KEYS[1], 'x') == ARGV[2] then
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if live and ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'x', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], 60000)
end
if live then return 1 end
return 0
