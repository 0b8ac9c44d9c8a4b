-- release.lua: give keys up unfinished, claimable again at once.
-- KEYS[i]        a record's key
-- ARGV[1]        1 when the handler never ran: the claim's attempt is taken back; else 0
-- per key:       owner token, fencing token
-- Reply, per key: {'ok', record} (the record's JSON text) or {'lost', record}.
-- The fencing token stays, so the next claim gets token + 1 and the released owner stays
-- fenced out; so do the attempts, unless ARGV[1] takes the claim's back.
indexed()
local now = now_ms()

local unrun = tonumber(ARGV[1])

return each(1, 2, function(key, owner, token)
  local rec = get_record(key)
  if not holds(rec, owner, token, now) then
    return reply('lost', rec)
  end
  local attempts = math.max(tonumber(rec.attempts) - unrun, 0)
  write(key, rec, nil, 'owner', '', 'lease', int(now), 'updated', int(now),
        'attempts', int(attempts), 'n', '1')
  count(key, rec)
  return reply('ok', rec)
end)
