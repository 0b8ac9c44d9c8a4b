-- complete.lua: store the result of the attempt that holds the key.
-- KEYS[1]  the record's hash
-- ARGV[1]  owner token
-- ARGV[2]  fencing token
-- ARGV[3]  result, JSON text
-- ARGV[4]  retention, ms: the record's TTL from now
-- Reply: {'ok', status, fp, ...} (the record in FIELDS order), or {'lost', ...} when that owner and token no longer
-- hold the key ({'lost'} alone when the record is gone). A retried complete is 'ok'.
local key, owner, token = KEYS[1], ARGV[1], ARGV[2]
local retention = tonumber(ARGV[4])
local now = now_ms()
local rec = get_record(key)
if rec ~= nil and rec.status == 'completed' and rec.done_by == owner and rec.token == token then
  return reply('ok', rec)
end
if not holds(rec, owner, token, now) then
  return reply('lost', rec)
end
write(key, rec, 'status', 'completed', 'owner', '', 'lease', '', 'updated', int(now),
  'completed', int(now), 'expires', int(now + retention), 'result', ARGV[3], 'done_by', owner)
if rec.error ~= '' or rec.retriable == '1' then
  write(key, rec, 'error', '', 'retriable', '0')  -- a success after a retriable failure
end
redis.call('PEXPIRE', key, retention)
return reply('ok', rec)
