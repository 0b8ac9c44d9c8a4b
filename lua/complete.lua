-- complete.lua: store the results of the attempts that hold the keys.
-- KEYS[i]        a record's key
-- ARGV[1]        retention, ms: each record's TTL from now
-- ARGV[2]        '1' to reply with the completed record, '0' for {'ok'} alone
-- then per key:  owner token, fencing token, result (JSON text)
-- Reply, per key: {'ok', record} (the record's JSON text), or {'lost', record} when
-- that owner and token no longer hold the key ({'lost'} alone when the record is gone).
-- A retried complete is 'ok'.
local retention, full = tonumber(ARGV[1]), ARGV[2] == '1'
local now = now_ms()

local function ok(rec)
  if full then return reply('ok', rec) end
  return {'ok'}
end

return each(2, 3, function(key, owner, token, result)
  local rec = get_record(key)
  if rec ~= nil and rec.status == 'completed' and rec.done_by == owner and rec.token == token then
    return ok(rec)
  end
  if not holds(rec, owner, token, now) then
    return reply('lost', rec)
  end
  -- error and retriable are cleared: a success after a retriable failure
  write(key, rec, retention, 'status', 'completed', 'owner', '', 'lease', '', 'updated', int(now),
    'completed', int(now), 'expires', int(now + retention), 'result', result, 'done_by', owner,
    'error', '', 'retriable', '0')
  return ok(rec)
end)
