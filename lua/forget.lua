-- forget.lua: delete a key so its next delivery runs again.
-- KEYS[1]  the record's hash
-- ARGV[1]  '1' to forget an in-progress key too
-- Reply: {code, status, fp, ...} with the record as it was (FIELDS order); code is
--   ok | missing | in_progress (refused: an attempt may still be working on it)
local key = KEYS[1]
local now = now_ms()
local rec = get_record(key)
if rec == nil or retention_over(rec, now) then
  return {'missing'}
end
if rec.status == 'in_progress' and ARGV[1] ~= '1' then
  return reply('in_progress', rec)
end
redis.call('DEL', key)
return reply('ok', rec)
