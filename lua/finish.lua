-- finish.lua: the end of attempts the sequence guard let through, on one server: advance
-- each entity and complete its key in one step, or neither.
-- KEYS           pairs: an entity's key (PREFIXentity:{ENTITY}), then its record's key
-- ARGV[1]        retention, ms: the TTL of the completed record and of the advanced entity
-- then per pair: sequence, the idempotency key (the entity's holder), owner token, fencing
--                token, result (JSON text)
-- Reply, per pair: 1 when that owner and token held both the key and the entity (see
-- complete.lua and settle.lua), and both are written now, or were by the same call before
-- (a retry); else 0, and nothing is written. A cluster, whose two keys may live on two
-- nodes, runs settle.lua and then complete.lua instead.
indexed()
local retention = tonumber(ARGV[1])
local now = now_ms()
local n = RECORDS / 2
local out = {}

for i = 1, n do
  local base = 1 + (i - 1) * 5
  local sequence, holder, owner, token, result = unpack(ARGV, base + 1, base + 5)
  local ekey, rkey = KEYS[2 * i - 1], KEYS[2 * i]
  local rec = get_record(rkey)
  if rec ~= nil and rec.status == 'completed' and rec.done_by == owner and rec.token == token then
    out[i] = 1  -- a retried call: this owner finished it
  else
    local entity = get_record(ekey)
    if holds(rec, owner, token, now) and entity_held(entity, holder, token, now) then
      advance_entity(ekey, entity, sequence, holder, retention, now)
      uncount(rkey, rec)
      complete_record(rkey, rec, owner, result, retention, now)
      count(rkey, rec)
      out[i] = 1
    else
      out[i] = 0
    end
  end
end
return out
