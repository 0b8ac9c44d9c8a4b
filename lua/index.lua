-- index.lua: count records written before the index (they have no n; `idemctl init` walks
-- the keyspace and sends them here). A record already counted is left alone (but for a
-- failed one, put in FAILED: an index from before FAILED lacks it), so a walk may be
-- repeated, and run while consumers work.
-- KEYS[i]        a record's key, then the index's keys (see indexed())
-- Reply, per key: 1 if this call counted it, 0 if not (counted already, gone, or kept
-- without a TTL past its retention: nothing would take it out of the counts).
indexed()
local now = now_ms()

return each(0, 0, function(key)
  local rec = get_record(key)
  if rec == nil then return 0 end
  if rec.n == '1' then  -- counted: an index from before FAILED lacks its failed keys
    if counted(rec) == 'f' then redis.call('ZADD', FAILED, tonumber(rec.expires), key) end
    return 0
  end
  if retention_over(rec, now) then
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then return 0 end
    write(key, rec, nil, 'gone', int(now + ttl), 'n', '1')  -- a tombstone
  else
    write(key, rec, nil, 'n', '1')
  end
  count(key, rec)
  return 1
end)
