-- prune.lua: take keys out of the index's LIVE that are no longer in progress there: their
-- record's TTL ended (an attempt abandoned for a lease and a retention), or it was deleted.
-- KEYS[i]        a key LIVE lists, then the index's keys (see indexed())
-- Reply, per key: 1 if it left LIVE, 0 if its record is in progress (it stays).
indexed()

return each(0, 0, function(key)
  local rec = get_record(key)
  if rec ~= nil and rec.status == 'in_progress' and rec.n == '1' then
    return 0
  end
  redis.call('ZREM', LIVE, key)
  return 1
end)
