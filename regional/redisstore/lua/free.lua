-- free: removes ARGV[i] from the slot set KEYS[i]. Returns {1}.
for i, key in ipairs(KEYS) do
  redis.call('ZREM', key, ARGV[i])
end
return {1}
