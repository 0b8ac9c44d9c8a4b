-- forget.lua: make keys as if never seen, so their next delivery runs again. Each record
-- becomes a tombstone whose retention is over (expires = now, no owner, lease or result)
-- that keeps the fencing counter, so the next claim gets token + 1; it lives ARGV[2] ms.
-- KEYS[i]        a record's key
-- ARGV[1]        '1' to forget in-progress keys too
-- ARGV[2]        retention, ms: the tombstone's TTL
-- Reply, per key: {code, record} with the record as it was (its JSON text); code is
--   ok | missing | in_progress (refused: an attempt may still be working on it)
indexed()
local force, retention = ARGV[1], tonumber(ARGV[2])
local now = now_ms()

return each(2, 0, function(key)
  local rec = get_record(key)
  if rec == nil or retention_over(rec, now) then
    return {'missing'}
  end
  if rec.status == 'in_progress' and force ~= '1' then
    return reply('in_progress', rec)
  end
  local before = TEXT[rec]
  uncount(key, rec)
  write(key, rec, retention, 'owner', '', 'lease', '', 'updated', int(now), 'expires', int(now),
    'result', '', 'done_by', '', 'gone', int(now + retention), 'n', '1')
  count(key, rec)
  return {'ok', before}
end)
