-- complete.lua: store the results of the attempts that hold the keys.
-- KEYS[i]        a record's key
-- ARGV[1]        retention, ms: each record's TTL from now
-- ARGV[2]        '1' to reply with what makes the completed record, '0' for {'ok'} alone
-- then per key:  owner token, fencing token, result (JSON text)
-- Reply, per key, with ARGV[2] '1': {'done', created, attempts, fp, now} when this call
-- completed it (the caller knows the rest: key, token, result, retention), or
-- {'ok', record} (the record's JSON text) for a retried complete, whose stored result may
-- not be this call's; with '0', {'ok'} for both. Otherwise {'lost', record} when that
-- owner and token no longer hold the key ({'lost'} alone when the record is gone).
indexed()
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
  uncount(key, rec)
  complete_record(key, rec, owner, result, retention, now)
  count(key, rec)
  if full then return {'done', rec.created, rec.attempts, rec.fp, rec.completed} end
  return {'ok'}
end)
