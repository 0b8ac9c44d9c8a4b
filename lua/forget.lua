-- forget.lua: delete keys so their next delivery runs again.
-- KEYS[i]        a record's key
-- ARGV[1]        '1' to forget in-progress keys too
-- Reply, per key: {code, record} with the record as it was (its JSON text); code is
--   ok | missing | in_progress (refused: an attempt may still be working on it)
local force = ARGV[1]
local now = now_ms()

return each(1, 0, function(key)
  local rec = get_record(key)
  if rec == nil or retention_over(rec, now) then
    return {'missing'}
  end
  if rec.status == 'in_progress' and force ~= '1' then
    return reply('in_progress', rec)
  end
  redis.call('DEL', key)
  return reply('ok', rec)
end)
