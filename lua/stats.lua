-- stats.lua: the index's counts, after taking the seconds that are over out of them.
-- KEYS           the index's keys (see indexed())
-- ARGV[1]        how many seconds that are over to take out of the counts at most
-- Reply: {{completed, failed, tombstones, entities, in LIVE, seconds taken out, in GONE,
-- in FAILED}}: a list of one, as every script's reply has one entry per item. ARGV[1] '0'
-- takes none: what the store asks to learn which slots' LIVE, GONE or FAILED have members.
-- FAILED's keys whose TTL ended are taken out too.
indexed()
local now = now_ms()
local expired = expire_due(now, tonumber(ARGV[1]))
if tonumber(ARGV[1]) > 0 then redis.call('ZREMRANGEBYSCORE', FAILED, '-inf', now) end
local c = redis.call('HMGET', COUNTS, 'c', 'f', 't', 'e')
return {{tonumber(c[1]) or 0, tonumber(c[2]) or 0, tonumber(c[3]) or 0, tonumber(c[4]) or 0,
  redis.call('ZCARD', LIVE), expired, redis.call('ZCARD', GONE), redis.call('ZCARD', FAILED)}}
