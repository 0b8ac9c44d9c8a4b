-- release.lua: give keys up unfinished, claimable again at once.
-- KEYS[i]        a record's hash
-- per key:       owner token, fencing token (no shared values)
-- Reply, per key: {'ok', status, fp, ...} (the record in FIELDS order) or {'lost', ...}.
-- Attempts and the fencing token stay, so the next claim gets token + 1 and the released
-- owner stays fenced out.
local now = now_ms()

return each(0, 2, function(key, owner, token)
  local rec = get_record(key)
  if not holds(rec, owner, token, now) then
    return reply('lost', rec)
  end
  write(key, rec, 'owner', '', 'lease', int(now), 'updated', int(now))
  return reply('ok', rec)
end)
