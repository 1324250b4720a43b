-- free: removes ARGV[i] from the slot set KEYS[i]. Returns {1}.
-- It has no deadline (late.lua): a holder is a reservation's unique id, so
-- a free is idempotent; run late, it frees a slot that would otherwise
-- stay taken until its TTL, and it can never free another holder's.
for i, key in ipairs(KEYS) do
  redis.call('ZREM', key, ARGV[i])
end
return {1}
