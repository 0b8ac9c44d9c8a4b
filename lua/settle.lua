-- settle.lua: the attempts the guard let through are done: advance their entities, or let go.
-- KEYS[i]        an entity's key (PREFIXentity:{ENTITY})
-- ARGV[1]        retention, ms: an advanced entity lives this long from now (its TTL)
-- then per key:  sequence, the idempotency key of the attempt, its fencing token, '1' when
--                its handler applied the event (advance the entity), '0' to only let go
-- Reply, per key: 1 when that key and token held the entity (also after its hold ended, if
-- nobody took it meanwhile), 0 when they no longer do: fenced like complete.lua. The
-- entity advances only to a sequence above its last; letting go keeps its TTL.
local retention = tonumber(ARGV[1])
indexed()
local now = now_ms()

return each(1, 4, function(key, sequence, holder, token, applied)
  local rec = get_record(key)
  if not entity_held(rec, holder, token, now) then
    return 0
  end
  if applied ~= '1' then
    write(key, rec, nil, 'holder', '', 'holder_token', '', 'lock', '', 'updated', int(now))
    return 1
  end
  advance_entity(key, rec, sequence, holder, retention, now)
  return 1
end)
