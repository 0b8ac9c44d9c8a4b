-- extend.lua: extend the lease of the attempt that holds the key (the heartbeat).
-- KEYS[1]  the record's hash
-- ARGV[1]  owner token
-- ARGV[2]  fencing token
-- ARGV[3]  new lease from now, ms
-- ARGV[4]  retention, ms (the in-progress record's TTL is lease + retention)
-- Reply: {'ok', status, fp, ...} (the record in FIELDS order) or {'lost', ...}.
local key, owner, token = KEYS[1], ARGV[1], ARGV[2]
local lease, retention = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local rec = get_record(key)
if not holds(rec, owner, token, now) then
  return reply('lost', rec)
end
write(key, rec, 'lease', int(now + lease), 'updated', int(now))
redis.call('PEXPIRE', key, lease + retention)
return reply('ok', rec)
