-- idempotency_release: delete our pending claim so that a retry runs the view again.
-- KEYS[1]  the record key
-- ARGV[1]  our pending value (owner token + fingerprint)
-- Returns  1 when our claim was deleted; 0 when the key holds something else (or nothing).
-- Running it twice is harmless: the second call finds nothing of ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
