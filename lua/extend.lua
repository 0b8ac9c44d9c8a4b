-- extend.lua: extend the leases of the attempts that hold the keys (the heartbeat).
-- KEYS[i]        a record's key
-- ARGV[1]        new lease from now, ms
-- ARGV[2]        retention, ms (an in-progress record's TTL is lease + retention)
-- then per key:  owner token, fencing token
-- Reply, per key: {'ok', record} (the record's JSON text) or {'lost', record}.
indexed()
local lease, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()

return each(2, 2, function(key, owner, token)
  local rec = get_record(key)
  if not holds(rec, owner, token, now) then
    return reply('lost', rec)
  end
  write(key, rec, lease + retention, 'lease', int(now + lease), 'updated', int(now), 'n', '1')
  count(key, rec)  -- the lease's new end; a record from before the index joins it
  return reply('ok', rec)
end)
