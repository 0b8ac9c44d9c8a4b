-- guard.lua: the sequence guard at claim time: may each attempt apply its event to its entity?
-- KEYS[i]        an entity's key (PREFIXentity:{ENTITY})
-- ARGV[1]        lease, ms: how long a go holds the entity (the key's lease)
-- ARGV[2]        retention, ms: the entity lives lease + retention past a go
-- then per key:  sequence, the idempotency key of the attempt, its fencing token
-- Reply, per key: {verdict, last, holder}, last the entity's last applied sequence ('' for
-- none), verdict one of
--   stale   the sequence is not above last: never run, whoever holds the entity
--   busy    another key's live hold, or a later attempt of the same key: holder names it
--   go      this attempt holds the entity until it settles (holder ''); the same key and
--           token asking again extend the hold, a later token of the same key takes it
-- An entity past retention is as if never seen. The same entity twice in one batch: the
-- second sees what the first wrote.
indexed()
local lease, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()

return each(2, 3, function(key, sequence, holder, token)
  local rec = get_record(key)
  local stored = rec
  if rec ~= nil and retention_over(rec, now) then rec = nil end
  local last = ''
  if rec ~= nil then last = rec.seq end
  local seq = tonumber(sequence)
  if last ~= '' and seq <= tonumber(last) then
    return {'stale', last, ''}
  end
  local t = tonumber(token)
  if rec ~= nil and entity_locked(rec, now)
    and (rec.holder ~= holder or (num(rec.holder_token) or 0) > t) then
    return {'busy', last, rec.holder}
  end
  local ends = now + lease
  uncount(key, stored)
  if rec == nil then
    rec = {seq = '', key = '', applied = ''}
  end
  -- Fields set in place and one SET, not write()'s varargs: a guard per message.
  rec.holder, rec.holder_token, rec.lock, rec.updated, rec.expires, rec.n =
    holder, int(t), int(ends), int(now), int(ends + retention), '1'
  redis.call('SET', key, cjson.encode(rec), 'PX', lease + retention)
  count(key, rec)
  return {'go', last, ''}
end)
