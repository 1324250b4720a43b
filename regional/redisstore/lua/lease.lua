-- lease: gives back the unused tokens of an earlier lease, then takes
-- between min and want tokens, or none.
-- Past its caller's deadline it changes nothing and answers LATE (late.lua),
-- the give-back included: its tokens are lost, as those of any give-back
-- that fails (under-admission until the bucket refills), never returned
-- twice by a late call and a caller's retry.
-- KEYS[1]: the bucket. ARGV: alg, amount, burst, period, return, window of
-- the returned tokens (sliding_window; µs; 0: the current one), min, want,
-- ahead (sliding_window; µs: the grant takes from what the window will
-- hold that much later, within the window; 0: now).
-- Returns: granted, available after, retry after (µs; when none was
-- granted), window start and time left (sliding_window; µs).
local now = now_us()
if late(now) then return redis.error_reply(LATE) end
local key = KEYS[1]
local alg, amount, burst, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ret, win, min, want = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local ahead = tonumber(ARGV[9] or 0)
local s = load(key, alg, burst, period, now)
if ret > 0 then
  if alg == 2 then
    roll(s, period, now)
    if win == 0 or win == s.t then
      s.a = math.max(0, s.a - ret)
    elseif win == s.t - period then
      s.b = math.max(0, s.b - ret)
    end
  else
    local t = math.max(now, last(s, alg))
    set_tokens(s, alg, math.min(burst, tokens(s, alg, amount, burst, period, t) + ret), amount, burst, period, t)
  end
end
local granted, retry = 0, 0
local at = now
if alg == 2 and ahead > 0 then
  roll(s, period, now)
  at = math.min(now + ahead, s.t + period - 1)
end
local g = math.min(want, math.floor(available(s, alg, amount, burst, period, at)))
if g >= min and g > 0 and take(s, alg, amount, burst, period, g, at) then
  granted = g
else
  local _, _, _, r = take({t = s.t, a = s.a, b = s.b}, alg, amount, burst, period, math.max(min, 0), now)
  retry = r
end
local _, _, reset = take({t = s.t, a = s.a, b = s.b}, alg, amount, burst, period, 0, now)
save(key, s, reset)
local start, left = 0, 0
if alg == 2 then start, left = s.t, s.t + period - now end
return {granted, math.floor(available(s, alg, amount, burst, period, now)), retry, start, left}
