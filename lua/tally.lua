-- tally.lua: the keys in progress as stats reports them, counted where they are, a part of
-- LIVE at a time (no record crosses the network): how many, how many stale (an owner whose
-- lease ended), released (no owner), and the oldest one's creation. A key whose record is
-- gone (its TTL ended) or no longer in progress leaves LIVE.
-- KEYS           the index's keys (see indexed())
-- ARGV[1]        how many members of LIVE to read at most; ARGV[2] the rank to start at
-- Reply: {{in progress, stale, released, oldest created (ms; '' when none), the rank to go
-- on at (-1: LIVE ends in this part)}}: a list of one, as every script's reply.
indexed()
local now = now_ms()
local size, start = tonumber(ARGV[1]), tonumber(ARGV[2])
local members = redis.call('ZRANGE', LIVE, start, start + size - 1)
local n, stale, released, gone = 0, 0, 0, 0
local oldest = nil
for _, key in ipairs(members) do
  local rec = get_record(key)
  if rec == nil or rec.status ~= 'in_progress' or rec.n ~= '1' then
    redis.call('ZREM', LIVE, key)
    gone = gone + 1
  else
    n = n + 1
    if rec.owner == '' then
      released = released + 1
    else
      local lease = num(rec.lease)
      if lease == nil or lease <= now then stale = stale + 1 end
    end
    local created = num(rec.created)
    if created ~= nil and (oldest == nil or created < oldest) then oldest = created end
  end
end
local next_rank = -1
if #members == size then next_rank = start + size - gone end
return {{n, stale, released, oldest and int(oldest) or '', next_rank}}
