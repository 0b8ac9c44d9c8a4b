-- fail.lua: record that the attempt holding the key failed.
-- KEYS[1]  the record's hash
-- ARGV[1]  owner token
-- ARGV[2]  fencing token
-- ARGV[3]  error text
-- ARGV[4]  '1' if a later claim may run the key again, '0' if it failed for good
-- ARGV[5]  retention, ms: the record's TTL from now
-- Reply: {'ok', status, fp, ...} or {'lost', ...}, as complete.lua. A retried fail is 'ok'.
local key, owner, token = KEYS[1], ARGV[1], ARGV[2]
local retention = tonumber(ARGV[5])
local now = now_ms()
local rec = get_record(key)
if rec ~= nil and rec.status == 'failed' and rec.done_by == owner and rec.token == token then
  return reply('ok', rec)
end
if not holds(rec, owner, token, now) then
  return reply('lost', rec)
end
write(key, rec, 'status', 'failed', 'owner', '', 'lease', '', 'updated', int(now),
  'expires', int(now + retention), 'error', ARGV[3], 'retriable', ARGV[4], 'done_by', owner)
redis.call('PEXPIRE', key, retention)
return reply('ok', rec)
