-- purge.lua: delete a record whose retention ended at least ARGV[1] ms ago.
-- Records expire by TTL, so this finds work only where a TTL was removed or lengthened by hand.
-- KEYS[1]  the record's hash
-- ARGV[1]  ms since the end of retention
-- Reply: 1 if deleted, 0 if kept.
local now = now_ms()
local rec = get_record(KEYS[1])
if rec == nil or num(rec.expires) == nil or num(rec.expires) > now - tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
