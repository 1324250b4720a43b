-- slots: adds a holder to every key's slot set if each holds fewer live
-- holders than its cap, and to none otherwise. A set is a sorted set of
-- holders scored by expiry (ms, Redis time); expired holders are dropped
-- first, so a crashed gateway's slots free themselves.
-- Past its caller's deadline it changes nothing and answers LATE (late.lua).
-- KEYS: the slot sets. ARGV, 3 per key: cap, holder, ttl (ms).
-- Returns, 3 per key: allowed (0/1), live holders, retry after (ms: until
-- the earliest holder expires, when rejected).
local t = redis.call('TIME')
if late(tonumber(t[1]) * 1000000 + tonumber(t[2])) then return redis.error_reply(LATE) end
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local admit, out = true, {}
for i, key in ipairs(KEYS) do
  local o = (i - 1) * 3
  local cap, holder = tonumber(ARGV[o + 1]), ARGV[o + 2]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local n = redis.call('ZCARD', key)
  local ok = redis.call('ZSCORE', key, holder) or n < cap
  local retry = 0
  if not ok then
    admit = false
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] then retry = tonumber(first[2]) - now end
  end
  out[#out + 1] = ok and 1 or 0
  out[#out + 1] = n
  out[#out + 1] = retry
end
if admit then
  for i, key in ipairs(KEYS) do
    local o = (i - 1) * 3
    redis.call('ZADD', key, now + tonumber(ARGV[o + 3]), ARGV[o + 2])
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', key, tonumber(last[2]) + 1000) -- the set outlives its last holder by a second
    out[o + 2] = redis.call('ZCARD', key)
  end
end
return out
