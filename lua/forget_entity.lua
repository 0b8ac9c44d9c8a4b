-- forget_entity.lua: remove entities of the sequence guard, so any sequence applies again.
-- KEYS[i]        an entity's key (PREFIXentity:{ENTITY})
-- ARGV[1]        '1' to remove a held entity too (its holder then cannot settle)
-- Reply, per key: {'missing'} when there is none (or it is past retention), else
-- {code, entity} with the entity as it was (its JSON text); code is
--   ok     removed
--   held   refused: an attempt holds it (a live hold) and force was not given
indexed()
local force = ARGV[1]
local now = now_ms()

return each(1, 0, function(key)
  local rec = get_record(key)
  if rec == nil or retention_over(rec, now) then
    return {'missing'}
  end
  if entity_locked(rec, now) and force ~= '1' then
    return reply('held', rec)
  end
  uncount(key, rec)
  redis.call('DEL', key)
  return reply('ok', rec)
end)
