-- _lib.lua: helpers prepended to every script below when it is loaded; not a script itself.
--
-- A record is one hash. Fields (all strings; '' where the value is absent):
--   status      in_progress | completed | failed
--   fp          payload fingerprint
--   owner       owner token of the attempt holding the lease ('' when nobody holds it)
--   token       fencing token: grows on every claim and takeover, never reused while the hash exists
--   attempts    how many claims ran the handler (release.lua may take one back)
--   lease       ms since the epoch when the lease ends (in_progress only)
--   created updated completed expires    ms since the epoch; expires = end of retention
--   result      JSON text of the handler's result
--   error retriable                      the last error, and '1' if a later claim may run it again
--   how         acquired | takeover: how the current owner got the key (replayed to a retried claim)
--   done_by     owner token that completed or failed it (a retried complete/fail is recognised)
-- Time is the server's: TIME, read once per call.
--
-- Every script works on a batch: KEYS[1..n] are records, ARGV holds the values shared by the
-- batch first, then the same number of values for each key, in KEYS order. The reply has
-- one entry per key. A single operation is a batch of one; on a cluster a batch holds keys
-- of one slot.

-- The order of the fields in every reply: {code, status, fp, owner, ..., done_by}.
local FIELDS = {'status', 'fp', 'owner', 'token', 'attempts', 'lease', 'created', 'updated',
  'completed', 'expires', 'result', 'error', 'retriable', 'how', 'done_by'}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
  return string.format('%d', n)
end

local function num(v)
  if v == nil or v == '' then return nil end
  return tonumber(v)
end

-- The record as a table of strings ('' for absent fields), or nil when there is none.
local function get_record(key)
  local values = redis.call('HMGET', key, unpack(FIELDS))
  if not values[1] then return nil end
  local rec = {}
  for i, f in ipairs(FIELDS) do rec[f] = values[i] or '' end
  return rec
end

-- HSET field/value pairs, keeping rec in step so the reply needs no second read.
local function write(key, rec, ...)
  local args = {...}
  for i = 1, #args, 2 do rec[args[i]] = args[i + 1] end
  redis.call('HSET', key, unpack(args))
end

-- The reply of every script: the code, then the record's fields in FIELDS order.
local function reply(code, rec)
  local out = {code}
  if rec == nil then return out end
  for i, f in ipairs(FIELDS) do out[i + 1] = rec[f] or '' end
  return out
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

-- fn(key, per-key values...) for every key; `shared` values lead ARGV, then `width` per key.
local function each(shared, width, fn)
  local out = {}
  for i, key in ipairs(KEYS) do
    local base = shared + (i - 1) * width
    out[i] = fn(key, unpack(ARGV, base + 1, base + width))
  end
  return out
end
