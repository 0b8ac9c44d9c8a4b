-- purge.lua: delete records whose retention ended at least ARGV[1] ms ago.
-- Records expire by TTL, so this finds work only in the tombstones forget.lua leaves (their
-- retention is over at once, their TTL is the store's retention), which the index's GONE
-- lists; the store walks GONE and sends its keys here.
-- KEYS[i]        a record's key, then the index's keys (see indexed())
-- ARGV[1]        ms since the end of retention
-- Reply, per key: 1 if deleted, 0 if kept. A key GONE lists whose record the TTL removed
-- leaves GONE.
indexed()
local older = tonumber(ARGV[1])
local now = now_ms()

return each(1, 0, function(key)
  local rec = get_record(key)
  if rec == nil then
    redis.call('ZREM', GONE, key)
    return 0
  end
  if num(rec.expires) == nil or num(rec.expires) > now - older then
    return 0
  end
  uncount(key, rec)
  redis.call('DEL', key)
  return 1
end)
