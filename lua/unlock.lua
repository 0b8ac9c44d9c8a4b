-- unlock.lua: an operator frees keys' leases; the fencing counter stays.
-- KEYS[i]        a record's key
-- ARGV[1]        'one': unlock each key (ARGV[2] = '1' to force a live lease)
--                'stale': unlock a key only if its lease ended at least ARGV[2] ms ago
-- Reply, per key: {code, record} (the record's JSON text); code is
--   ok                the lease is freed (or was already free, for 'one')
--   missing           no record (or past retention)
--   not_in_progress   completed or failed: there is no lease
--   live              the lease is live and force was not given
--   skipped           'stale': not stale long enough, or already freed
indexed()
local mode, arg = ARGV[1], ARGV[2]
local now = now_ms()

return each(2, 0, function(key)
  local rec = get_record(key)
  if rec == nil or retention_over(rec, now) then
    return {'missing'}
  end
  if rec.status ~= 'in_progress' then
    if mode == 'stale' then return reply('skipped', rec) end
    return reply('not_in_progress', rec)
  end
  if mode == 'stale' then
    if rec.owner == '' or num(rec.lease) > now - tonumber(arg) then
      return reply('skipped', rec)
    end
  elseif lease_live(rec, now) and arg ~= '1' then
    return reply('live', rec)
  end
  if rec.owner ~= '' then
    write(key, rec, nil, 'owner', '', 'lease', int(now), 'updated', int(now), 'n', '1')
    count(key, rec)
  end
  return reply('ok', rec)
end)
