-- take: charges every key's cost if each non-shadow one admits, else none.
-- KEYS: the buckets (a key may repeat: its costs add up, in order).
-- Past its caller's deadline it changes nothing and answers LATE (late.lua).
-- ARGV, 6 per key: alg, amount, burst, period, cost, shadow (0/1).
-- Returns, 5 per key: allowed (0/1), remaining, reset after, retry after
-- (µs), window start (sliding_window; µs).
local now = now_us()
if late(now) then return redis.error_reply(LATE) end
local state, resets, out = {}, {}, {}
local admit = true
for i, key in ipairs(KEYS) do
  local o = (i - 1) * 6
  local alg, amount, burst = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
  local period, cost, shadow = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5]), ARGV[o + 6] == '1'
  local s = state[key] or load(key, alg, burst, period, now)
  local trial = {t = s.t, a = s.a, b = s.b}
  local ok, rem, reset, retry = take(trial, alg, amount, burst, period, cost, now)
  if ok then
    state[key], resets[key] = trial, reset
  else
    state[key] = s
    admit = admit and shadow
  end
  local win = 0
  if alg == 2 then win = trial.t end
  out[#out + 1] = ok and 1 or 0
  out[#out + 1] = math.floor(rem)
  out[#out + 1] = reset
  out[#out + 1] = retry
  out[#out + 1] = win
end
if admit then
  for key, reset in pairs(resets) do
    save(key, state[key], reset)
  end
end
return out
