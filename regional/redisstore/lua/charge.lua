-- charge: charges every key's cost even below zero: usage settled above
-- what a reservation held. The next requests wait until it has refilled.
-- KEYS: the buckets (a key may repeat: its costs add up, in order).
-- Past its caller's deadline it changes nothing and answers LATE (late.lua).
-- ARGV, 5 per key: alg, amount, burst, period, cost.
-- Returns, 2 per key: remaining (whole tokens, ≥ 0), reset after (µs).
local now = now_us()
if late(now) then return redis.error_reply(LATE) end
local state, resets, out = {}, {}, {}
for i, key in ipairs(KEYS) do
  local o = (i - 1) * 5
  local alg, amount, burst = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
  local period, cost = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5])
  local s = state[key] or load(key, alg, burst, period, now)
  local rem, reset
  if alg ~= 2 then
    local t = math.max(now, last(s, alg))
    local tok = tokens(s, alg, amount, burst, period, t) - cost
    set_tokens(s, alg, tok, amount, burst, period, t)
    rem, reset = math.max(0, tok), wait(burst - tok, amount, period)
  else
    roll(s, period, now)
    s.a = s.a + cost
    local _, r, rs = take({t = s.t, a = s.a, b = s.b}, alg, amount, burst, period, 0, now)
    rem, reset = r, rs
  end
  state[key], resets[key] = s, reset
  out[#out + 1] = math.floor(rem)
  out[#out + 1] = reset
end
for key, reset in pairs(resets) do
  save(key, state[key], reset)
end
return out
