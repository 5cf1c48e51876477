-- session_cutoff: remember when a user's sessions were all ended, for the sessions the
-- previous session engine still holds (they are ended on their next load here).
-- KEYS[1]: the user's cutoff key (same hash tag as the user's index).
-- ARGV[1]: how long to keep it, ms (the longest a previous engine's session can live);
-- ARGV[2]: the sid of the session kept (the caller's own), or ''.
-- Stores '<ms since the epoch>:<kept sid>' (Redis time: the clock session_adopt stamps
-- with). Returns that time.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], now .. ':' .. ARGV[2], 'PX', ARGV[1])
return now
