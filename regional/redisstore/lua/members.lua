-- members: records ARGV[1] as a live instance for ARGV[2] ms (0: leaves)
-- in the sorted set KEYS[1], scored by expiry, and returns how many
-- instances are live (a one-element array).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return {redis.call('ZCARD', KEYS[1])}
