-- complete.lua: store the results of the attempts that hold the keys.
-- KEYS[i]        a record's hash
-- ARGV[1]        retention, ms: each record's TTL from now
-- ARGV[2]        '1' to reply with the completed record, '0' for {'ok'} alone
-- then per key:  owner token, fencing token, result (JSON text)
-- Reply, per key: {'ok', status, fp, ...} (the record in FIELDS order), or {'lost', ...} when
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
  write(key, rec, 'status', 'completed', 'owner', '', 'lease', '', 'updated', int(now),
    'completed', int(now), 'expires', int(now + retention), 'result', result, 'done_by', owner)
  if rec.error ~= '' or rec.retriable == '1' then
    write(key, rec, 'error', '', 'retriable', '0')  -- a success after a retriable failure
  end
  redis.call('PEXPIRE', key, retention)
  return ok(rec)
end)
