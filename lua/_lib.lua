-- _lib.lua: helpers prepended to every script below when it is loaded; not a script itself.
--
-- A record is one string key holding a JSON object of text fields ('' or absent where the
-- value is absent); GET shows it as it is:
--   status      in_progress | completed | failed
--   fp          payload fingerprint
--   owner       owner token of the attempt holding the lease ('' when nobody holds it)
--   token       fencing token: grows by one on every claim and takeover; a key with no record
--               starts at the server's TIME in µs, above any token of a deleted earlier life
--   attempts    how many claims ran the handler (release.lua may take one back)
--   lease       ms since the epoch when the lease ends (in_progress only)
--   created updated completed expires    ms since the epoch; expires = end of retention
--   result      JSON text of the handler's result
--   error retriable                      the last error, and '1' if a later claim may run it again
--   how         acquired | takeover: how the current owner got the key (replayed to a retried claim)
--   done_by     owner token that completed or failed it (a retried complete/fail is recognised)
--
-- An entity of the sequence guard (guard.lua, settle.lua, forget_entity.lua) is one string
-- key too, PREFIXentity:{ENTITY}, out of the records' PREFIX{KEY} namespace, holding a JSON
-- object of text fields in the same way:
--   seq         the last sequence applied ('' while its first event is being handled)
--   key         the idempotency key whose handler applied seq
--   applied     ms since the epoch when seq was applied
--   holder      the key whose attempt holds the entity now ('' when none does)
--   holder_token  that attempt's fencing token
--   lock        ms since the epoch when the hold ends
--   updated expires                      ms since the epoch; expires = end of retention
-- Its TTL is the time left until expires. Sequences and tokens stay below 2^53, exact in a
-- Lua number: compare them as numbers, write them with int(), never tostring() (1e+15).
--
-- One string rather than a hash: a GET and a SET ... PX cost the server about a third less
-- than HMGET, HSET and PEXPIRE, and every transition reads and writes the whole record.
-- Time is the server's: TIME, read once per call.
--
-- Every script works on a batch: KEYS[1..n] are records (or entities), ARGV holds the
-- values shared by the batch first, then the same number of values for each key, in KEYS
-- order. The reply has one entry per key. A single operation is a batch of one; on a
-- cluster a batch holds keys of one slot.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- TIME read once, as ms and as µs since the epoch (µs: under 2^53, exact in a Lua number).
local function now_ms_us()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

local function int(n)
  return string.format('%d', n)
end

local function num(v)
  if v == nil or v == '' then return nil end
  return tonumber(v)
end

-- Fields a record lacks read as ''.
local ABSENT = {__index = function() return '' end}
-- Each record table's JSON text as stored, so a reply needs no second encoding.
local TEXT = {}

-- The record as a table of strings, or nil when there is none.
local function get_record(key)
  local text = redis.call('GET', key)
  if not text then return nil end
  local rec = setmetatable(cjson.decode(text), ABSENT)
  TEXT[rec] = text
  return rec
end

-- Set field/value pairs in rec and store it, with a TTL of ttl ms (nil: keep the TTL).
local function write(key, rec, ttl, ...)
  local args = {...}
  for i = 1, #args, 2 do rec[args[i]] = args[i + 1] end
  local text = cjson.encode(rec)
  TEXT[rec] = text
  if ttl then
    redis.call('SET', key, text, 'PX', ttl)
  else
    redis.call('SET', key, text, 'KEEPTTL')
  end
end

-- The reply of every script but claim's acquired: the code, then the record's JSON text.
local function reply(code, rec)
  if rec == nil then return {code} end
  return {code, TEXT[rec]}
end

local function retention_over(rec, now)
  local e = num(rec.expires)
  return e ~= nil and e <= now
end

local function holds(rec, owner, token, now)
  return rec ~= nil and not retention_over(rec, now) and rec.status == 'in_progress'
    and rec.owner == owner and rec.token == token
end

local function lease_live(rec, now)
  return rec.status == 'in_progress' and rec.owner ~= '' and num(rec.lease) ~= nil and num(rec.lease) > now
end

-- How many of KEYS are records (or entities): all of them, but for the index's four keys
-- that a script changing records gets last (see indexed()).
local RECORDS = #KEYS

-- fn(key, per-key values...) for every key; `shared` values lead ARGV, then `width` per key.
local function each(shared, width, fn)
  local out = {}
  for i = 1, RECORDS do
    local key = KEYS[i]
    local base = shared + (i - 1) * width
    out[i] = fn(key, unpack(ARGV, base + 1, base + width))
  end
  return out
end

-- The index: what the operator's commands read instead of every key. Every script that
-- changes a record gets its five keys after the records' (one set per server; on a cluster
-- one per hash slot, named so as to live in the records' slot):
--   LIVE   sorted set: each in-progress record's key, scored by its lease (ms since the
--          epoch), as the record has it
--   COUNTS hash: c, f, t, e: how many completed, failed, and forgotten records (tombstones,
--          past retention) there are, and entities; and c:SECOND, f:SECOND, t:SECOND,
--          e:SECOND: how many of them the TTL removes at the end of that second (the
--          ceiling of their TTL's end: an entity's expires, as for completed and failed)
--   DUE    sorted set: the SECONDs COUNTS has fields for, scored by themselves
--   GONE   sorted set: each tombstone's key, scored by the end of its retention (what
--          purge walks)
--   FAILED sorted set: each failed record's key, scored by the end of its retention (what
--          `list --status failed` walks, from now on: a key whose TTL ended stays until
--          stats.lua takes it out)
-- A tombstone (forget.lua) carries gone: ms since the epoch when its TTL ends. A record the
-- index counts carries n = '1' (records written before the index have none:
-- `idemctl init` counts them, see index.lua). Redis removes a record when its TTL ends and
-- runs no script then: expire_due() takes a second's records out of the counts once that second
-- is over, so a record is counted at most a second past the end of its TTL. A record still
-- there at the very end of its second (Redis removes it just after) finds its field gone:
-- uncount() leaves the counts alone, as expire_due() took it out already.
local LIVE, COUNTS, DUE, GONE, FAILED

local function indexed()
  LIVE, COUNTS, DUE, GONE, FAILED =
    KEYS[#KEYS - 4], KEYS[#KEYS - 3], KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
  RECORDS = #KEYS - 5
end

-- Where rec (a record or an entity) is counted: 'i' (in LIVE), or 'c', 'f', 't' or 'e'
-- with the second its TTL ends; nil when it is not counted.
local function counted(rec)
  if rec == nil or rec.n ~= '1' then return nil end
  local status, gone, expires = rec.status or '', rec.gone or '', rec.expires or ''
  if status == '' then return 'e', math.ceil(tonumber(expires) / 1000) end
  if gone ~= '' then return 't', math.ceil(tonumber(gone) / 1000) end
  if status == 'in_progress' then return 'i' end
  if expires == '' then return nil end
  return string.sub(status, 1, 1), math.ceil(tonumber(expires) / 1000)
end

-- Take rec (as it is before a change) out of the index.
local function uncount(key, rec)
  local class, second = counted(rec)
  if class == nil then return end
  if class == 'i' then
    redis.call('ZREM', LIVE, key)
    return
  end
  if class == 't' then redis.call('ZREM', GONE, key) end
  if class == 'f' then redis.call('ZREM', FAILED, key) end
  local field = class .. ':' .. int(second)
  if redis.call('HEXISTS', COUNTS, field) == 1 then  -- else expired: c/f/t no longer count it
    redis.call('HINCRBY', COUNTS, field, -1)
    redis.call('HINCRBY', COUNTS, class, -1)
  end
end

-- Tell the processes waiting for key (wait=) that nobody holds it now: a message on the
-- index's channel (one per server, on a cluster one per hash slot), the key's name in it.
-- SPUBLISH, sharded, where the server has it (7.0 on), else PUBLISH. A hint only: a waiter
-- claims again, and polls where no message comes.
local function wake(key)
  local channel = LIVE .. ':wake'
  local sent = redis.pcall('SPUBLISH', channel, key)
  if type(sent) == 'table' and sent.err then redis.call('PUBLISH', channel, key) end
end

-- Put rec (as just written, with n = '1') in the index; a record nobody holds wakes its
-- waiters.
local function count(key, rec)
  if rec.status ~= nil and rec.status ~= '' and (rec.status ~= 'in_progress' or rec.owner == '') then
    wake(key)
  end
  local class, second = counted(rec)
  if class == 'i' then
    redis.call('ZADD', LIVE, tonumber(rec.lease), key)
    return
  end
  if class == 't' then redis.call('ZADD', GONE, tonumber(rec.expires), key) end
  if class == 'f' then redis.call('ZADD', FAILED, tonumber(rec.expires), key) end
  local s = int(second)
  redis.call('HINCRBY', COUNTS, class .. ':' .. s, 1)
  redis.call('HINCRBY', COUNTS, class, 1)
  redis.call('ZADD', DUE, second, s)
end

-- Take up to `limit` seconds that are over out of the counts;
-- returns how many it took.
local function expire_due(now, limit)
  local due = redis.call('ZRANGEBYSCORE', DUE, '-inf', math.floor(now / 1000), 'LIMIT', 0, limit)
  for _, s in ipairs(due) do
    for _, class in ipairs({'c', 'f', 't', 'e'}) do
      local field = class .. ':' .. s
      local n = tonumber(redis.call('HGET', COUNTS, field))
      if n ~= nil then
        if n ~= 0 then redis.call('HINCRBY', COUNTS, class, -n) end  -- never '-0'
        redis.call('HDEL', COUNTS, field)
      end
    end
    redis.call('ZREM', DUE, s)
  end
  return #due
end

-- An entity whose hold is live: a holder whose lock has not ended.
local function entity_locked(rec, now)
  return rec.holder ~= '' and num(rec.lock) ~= nil and num(rec.lock) > now
end

-- Complete rec (held by owner, see holds()) with result: stored with a TTL of retention ms.
-- Fields set in place rather than through write(), whose varargs cost this, the commonest
-- write, about 1 us per key. error and retriable are cleared: a success after a retriable
-- failure.
local function complete_record(key, rec, owner, result, retention, now)
  local at = int(now)
  rec.status, rec.owner, rec.lease, rec.updated, rec.completed = 'completed', '', '', at, at
  rec.expires, rec.result, rec.done_by, rec.error, rec.retriable, rec.n =
    int(now + retention), result, owner, '', '0', '1'
  redis.call('SET', key, cjson.encode(rec), 'PX', retention)
end

-- Whether holder's attempt with token holds the entity rec (also after its hold ended, if
-- nobody took it meanwhile): what settle and finish are fenced by.
local function entity_held(rec, holder, token, now)
  return rec ~= nil and not retention_over(rec, now) and rec.holder ~= ''
    and rec.holder == holder and num(rec.holder_token) == tonumber(token)
end

-- The holder's event (sequence) was applied: advance the entity (only upwards), free it,
-- and keep it for retention ms.
local function advance_entity(key, rec, sequence, holder, retention, now)
  uncount(key, rec)
  local seq = tonumber(sequence)
  if rec.seq == '' or seq > tonumber(rec.seq) then
    rec.seq, rec.key, rec.applied = int(seq), holder, int(now)
  end
  rec.holder, rec.holder_token, rec.lock, rec.updated, rec.expires, rec.n =
    '', '', '', int(now), int(now + retention), '1'
  redis.call('SET', key, cjson.encode(rec), 'PX', retention)
  count(key, rec)
end
