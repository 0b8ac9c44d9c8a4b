-- A fenced write on a resource of the user's (idemctl.fence.redis): refused when the
-- resource's fence holds a newer token of the same idempotency key. Standalone: no _lib.
--
-- KEYS[1]  the resource (a string, a hash or a stream)
-- KEYS[2]  its fence: a hash in the same hash slot (idemctl.fence.redis.fence_key)
-- ARGV[1]  the write: "set", "hset" or "xadd"
-- ARGV[2]  the idempotency key the writer holds
-- ARGV[3]  the writer's fencing token (an integer, below 2^53)
-- ARGV[4..] the write's own arguments:
--   set:  value, then "" or the value's TTL in milliseconds
--   hset: field, value, field, value, ...
--   xadd: field, value, ... (the entry's id is the server's: *)
--
-- Tokens are compared per key. set and hset keep the last writer in the fence ("key",
-- "token"): a write under another key is accepted, a write of the same key with an older
-- token refused. xadd keeps one field per key ("<token> <entry id>"): a key appends once;
-- a newer token of a key that has appended gets the entry it appended, not another.
--
-- Reply: {1, result} written ({1, id} for xadd); {2, id}: xadd of a key that has appended
-- (under an older or the same token); {0, key, token}: refused, the fence's key and token.

local op, key, token = ARGV[1], ARGV[2], tonumber(ARGV[3])

if op == "xadd" then
  local held = redis.call("HGET", KEYS[2], key)
  if held then
    local held_token, id = string.match(held, "^(%d+) (.+)$")
    if tonumber(held_token) > token then
      return {0, key, held_token}
    end
    return {2, id}
  end
  local id = redis.call("XADD", KEYS[1], "*", unpack(ARGV, 4))
  redis.call("HSET", KEYS[2], key, ARGV[3] .. " " .. id)
  return {1, id}
end

local last = redis.call("HMGET", KEYS[2], "key", "token")
if last[1] == key and tonumber(last[2]) > token then
  return {0, last[1], last[2]}
end
local result
if op == "set" then
  if ARGV[5] ~= "" then
    result = redis.call("SET", KEYS[1], ARGV[4], "PX", ARGV[5])
  else
    result = redis.call("SET", KEYS[1], ARGV[4])
  end
  result = 1
elseif op == "hset" then
  result = redis.call("HSET", KEYS[1], unpack(ARGV, 4))
else
  return redis.error_reply("fence.lua: unknown write " .. tostring(op))
end
redis.call("HSET", KEYS[2], "key", key, "token", ARGV[3])
return {1, result}
