-- release.lua: give the key up unfinished, claimable again at once.
-- KEYS[1]  the record's hash
-- ARGV[1]  owner token
-- ARGV[2]  fencing token
-- Reply: {'ok', status, fp, ...} (the record in FIELDS order) or {'lost', ...}. Attempts and the fencing token stay,
-- so the next claim gets token + 1 and the released owner stays fenced out.
local key, owner, token = KEYS[1], ARGV[1], ARGV[2]
local now = now_ms()
local rec = get_record(key)
if not holds(rec, owner, token, now) then
  return reply('lost', rec)
end
write(key, rec, 'owner', '', 'lease', int(now), 'updated', int(now))
return reply('ok', rec)
