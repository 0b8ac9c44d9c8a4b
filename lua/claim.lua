-- claim.lua: claim keys for one attempt each, taking over expired or released leases.
-- KEYS[i]        a record's key
-- ARGV[1]        lease, ms
-- ARGV[2]        retention, ms: an in-progress record lives lease + retention, so an
--                abandoned key keeps its fencing counter and attempts as long as a finished one
-- then per key:  payload fingerprint ('' for none), owner token of this attempt (random,
--                made by the client)
-- Reply, per key: {code, token, attempts, lease} when acquired, where code is
--   acquired   new key, past retention, or a retriable failure: this attempt holds it; a key
--              with no record starts at token TIME in µs, one past retention (or forgotten)
--              at its token + 1
--   takeover   an expired or released in-progress key: this attempt holds it, token + 1
-- else {code, record} (the record's JSON text), code one of
--   completed | failed | busy | mismatch   not acquired; the record says why
-- A retried call (same owner token) gets its first reply again; the same key twice in one
-- batch is busy the second time.
indexed()
local lease, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, now_us = now_ms_us()
expire_due(now, 2)  -- the TTL's work, a little at a time, so the operator's stats find little

local function acquired(how, rec)
  return {how, rec.token, rec.attempts, rec.lease}
end

return each(2, 2, function(key, fp, owner)
  local rec = get_record(key)
  if rec == nil or retention_over(rec, now) then
    -- New, or as if never seen; the fencing counter still goes on past retention. With no
    -- record at all (never seen, purged, expired by TTL) the clock starts it: every token
    -- the key had was at most TIME in µs when it was claimed.
    local token = now_us
    if rec ~= nil then
      token = tonumber(rec.token) + 1
      uncount(key, rec)
    end
    -- Built whole and written directly, not through write(): the commonest call, and the
    -- varargs cost it about 2 µs.
    local at = int(now)
    rec = {status = 'in_progress', fp = fp, owner = owner, token = int(token), attempts = '1',
      lease = int(now + lease), created = at, updated = at, how = 'acquired', n = '1'}
    redis.call('SET', key, cjson.encode(rec), 'PX', lease + retention)
    count(key, rec)
    return acquired('acquired', rec)
  end
  if rec.status == 'in_progress' and rec.owner == owner then
    return acquired(rec.how, rec)
  end
  if fp ~= '' and rec.fp ~= '' and rec.fp ~= fp then
    return reply('mismatch', rec)
  end
  if rec.status == 'completed' then
    return reply('completed', rec)
  end
  if rec.status == 'failed' and rec.retriable ~= '1' then
    return reply('failed', rec)
  end
  if lease_live(rec, now) then
    return reply('busy', rec)
  end
  local how = 'acquired'
  if rec.status == 'in_progress' then how = 'takeover' end
  local fingerprint = rec.fp
  if fingerprint == '' then fingerprint = fp end
  uncount(key, rec)
  write(key, rec, lease + retention, 'status', 'in_progress', 'fp', fingerprint, 'owner', owner,
    'token', int(tonumber(rec.token) + 1), 'attempts', int(tonumber(rec.attempts) + 1),
    'lease', int(now + lease), 'updated', int(now), 'completed', '', 'expires', '',
    'how', how, 'done_by', '', 'n', '1')
  count(key, rec)
  return acquired(how, rec)
end)
