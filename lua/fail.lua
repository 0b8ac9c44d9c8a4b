-- fail.lua: record that the attempts holding the keys failed.
-- KEYS[i]        a record's key
-- ARGV[1]        retention, ms: each record's TTL from now
-- then per key:  owner token, fencing token, error text, '1' if a later claim may run the
--                key again ('0': failed for good)
-- Reply, per key: {'ok', record} or {'lost', record}, as complete.lua. A retried fail is 'ok'.
indexed()
local retention = tonumber(ARGV[1])
local now = now_ms()

return each(1, 4, function(key, owner, token, err, retriable)
  local rec = get_record(key)
  if rec ~= nil and rec.status == 'failed' and rec.done_by == owner and rec.token == token then
    return reply('ok', rec)
  end
  if not holds(rec, owner, token, now) then
    return reply('lost', rec)
  end
  uncount(key, rec)
  write(key, rec, retention, 'status', 'failed', 'owner', '', 'lease', '', 'updated', int(now),
    'expires', int(now + retention), 'error', err, 'retriable', retriable, 'done_by', owner,
    'n', '1')
  count(key, rec)
  return reply('ok', rec)
end)
