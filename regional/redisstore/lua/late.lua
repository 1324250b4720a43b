-- late: the prologue of every script that charges (take, lease, charge,
-- slots). ARGV[1] is the caller's deadline in unix µs, less a margin
-- (0: none); it is taken off ARGV, so the script's own arguments start at
-- ARGV[1]. A script checks late(now) on Redis time before it changes
-- anything: past the deadline its caller has given up and decided without
-- it (on_failure), so it changes nothing and answers the error LATE.
local DEADLINE = tonumber(table.remove(ARGV, 1))
local LATE = 'LATE the call reached Redis after its deadline: nothing changed'

local function late(now_us)
  return DEADLINE > 0 and now_us > DEADLINE
end
