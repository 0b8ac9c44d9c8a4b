-- purge.lua: delete records whose retention ended at least ARGV[1] ms ago.
-- Records expire by TTL, so this finds work only in the tombstones forget.lua leaves (their
-- retention is over at once, their TTL is the store's retention) and where a TTL was removed
-- or lengthened by hand.
-- KEYS[i]        a record's key
-- ARGV[1]        ms since the end of retention
-- Reply, per key: 1 if deleted, 0 if kept.
local older = tonumber(ARGV[1])
local now = now_ms()

return each(1, 0, function(key)
  local rec = get_record(key)
  if rec == nil or num(rec.expires) == nil or num(rec.expires) > now - older then
    return 0
  end
  redis.call('DEL', key)
  return 1
end)
