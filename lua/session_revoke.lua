-- session_revoke: one batch of logout_everywhere: delete the given sessions, hand back the next.
-- KEYS[1]: the user's index (zset); KEYS[2..n]: data keys of the sessions to delete (same tag).
-- ARGV[1]: sid to keep ('' = none); ARGV[2]: batch size; ARGV[3..]: the sids of KEYS[2..n].
-- Returns {live sessions deleted, up to batch-size sids still indexed (never ARGV[1])}.
-- Idempotent: a re-sent batch deletes nothing more.
local idx, keep, limit = KEYS[1], ARGV[1], tonumber(ARGV[2])
local deleted = 0
for i = 2, #KEYS do
  if redis.pcall('HEXISTS', KEYS[i], 'd') == 1 then deleted = deleted + 1 end
  redis.call('DEL', KEYS[i])
  redis.call('ZREM', idx, ARGV[i + 1])
end
local nxt = {}
for _, sid in ipairs(redis.call('ZRANGE', idx, 0, limit)) do
  if sid ~= keep and #nxt < limit then nxt[#nxt + 1] = sid end
end
return {deleted, nxt}
