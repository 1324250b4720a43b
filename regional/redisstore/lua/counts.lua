-- counts: one key's window of a shared-mode limit, as the instances of a
-- region share it (regional.CountStore). The hash KEYS[1] has a field
-- "i:<instance>" per instance (its own count) and "r:<region>" per peer
-- region (that region's slot). Every write raises a field to the value
-- written, never lowers it.
--
-- ARGV[1] instance ('' writes no instance field), ARGV[2] its count,
-- ARGV[3] time to live (ms), then pairs of peer region and slot.
-- Returns {instance's field, sum of the instance fields, region, slot, ...}.
local function raise(field, v)
  local cur = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  if v > cur then
    redis.call('HSET', KEYS[1], field, v)
  end
end
if ARGV[1] ~= '' then
  raise('i:' .. ARGV[1], tonumber(ARGV[2]))
end
for i = 4, #ARGV, 2 do
  raise('r:' .. ARGV[i], tonumber(ARGV[i + 1]))
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
local all = redis.call('HGETALL', KEYS[1])
local own, sum, out = 0, 0, {0, 0}
for i = 1, #all, 2 do
  local f, v = all[i], tonumber(all[i + 1])
  if string.sub(f, 1, 2) == 'i:' then
    sum = sum + v
    if string.sub(f, 3) == ARGV[1] then
      own = v
    end
  else
    out[#out + 1] = string.sub(f, 3)
    out[#out + 1] = v
  end
end
out[1], out[2] = own, sum
return out
