-- Bucket math shared by take.lua and lease.lua: the same algorithms as
-- regional/algo.go, on Redis time in microseconds. A key is one hash:
--   token_bucket:   t = last refill, a = tokens
--   gcra:           t = theoretical arrival time, b = last update
--   sliding_window: t = current window start, a = current count, b = previous count
-- Params come as ARGV, per key: alg (0 token_bucket, 1 gcra, 2 sliding_window),
-- amount per period, burst, period (µs).

local MAXWAIT = 366 * 24 * 3600 * 1000000

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function load(key, alg, burst, period, now)
  local v = redis.call('HMGET', key, 't', 'a', 'b')
  if v[1] then
    return {t = tonumber(v[1]), a = tonumber(v[2]) or 0, b = tonumber(v[3]) or 0}
  end
  if alg == 0 then return {t = now, a = burst, b = 0} end
  if alg == 1 then return {t = now, a = 0, b = now} end
  return {t = now - now % period, a = 0, b = 0}
end

-- save writes s and lets the key expire once it is back to full (reset µs).
local function save(key, s, reset)
  redis.call('HSET', key, 't', s.t, 'a', s.a, 'b', s.b)
  redis.call('PEXPIRE', key, math.ceil(reset / 1000) + 1000)
end

local function wait(missing, amount, period)
  if missing <= 0 then return 0 end
  if amount <= 0 then return MAXWAIT end
  local w = math.ceil(missing * period / amount)
  if w >= MAXWAIT then return MAXWAIT end
  return w
end

local function last(s, alg)
  if alg == 1 then return s.b end
  return s.t
end

-- tokens is what a token bucket or gcra state holds at now >= last(s).
local function tokens(s, alg, amount, burst, period, now)
  if alg == 0 then
    if s.a >= burst then return burst end
    return math.min(burst, s.a + (now - s.t) * amount / period)
  end
  local debt = s.t - now
  if debt <= 0 then return burst end
  return burst - debt * amount / period
end

local function set_tokens(s, alg, tok, amount, burst, period, now)
  if alg == 0 then
    s.t, s.a = now, tok
  else
    s.t, s.b = now + wait(burst - tok, amount, period), now
  end
end

local function roll(s, period, now)
  local ws = now - now % period
  if ws == s.t + period then
    s.t, s.b, s.a = ws, s.a, 0
  elseif ws > s.t then
    s.t, s.b, s.a = ws, 0, 0
  end
end

local function window_retry(s, amount, period, cost, left)
  local room = amount - s.a - cost
  if room >= 0 and s.b > 0 then
    return math.ceil(left - room * period / s.b)
  end
  if cost > amount then return MAXWAIT end
  if s.a <= 0 then return math.ceil(left) end
  return math.ceil(left + math.max(0, period - (amount - cost) * period / s.a))
end

-- take charges cost to s at now if it fits, and returns
-- allowed, remaining, reset after (µs), retry after (µs).
local function take(s, alg, amount, burst, period, cost, now)
  if alg ~= 2 then
    now = math.max(now, last(s, alg))
    local tok = tokens(s, alg, amount, burst, period, now)
    local ok, retry = cost <= tok, 0
    if ok then
      tok = tok - cost
    elseif cost > burst then
      retry = MAXWAIT
    else
      retry = wait(cost - tok, amount, period)
    end
    set_tokens(s, alg, tok, amount, burst, period, now)
    return ok, math.max(0, tok), wait(burst - tok, amount, period), retry
  end
  roll(s, period, now)
  now = math.max(now, s.t)
  local left = s.t + period - now
  local est = s.b * left + s.a * period
  local ok, retry = est + cost * period <= amount * period, 0
  if ok then
    s.a = s.a + cost
    est = est + cost * period
  else
    retry = window_retry(s, amount, period, cost, left)
  end
  local reset = 0
  if s.a > 0 then
    reset = s.t + 2 * period - now
  elseif s.b > 0 then
    reset = s.t + period - now
  end
  return ok, math.max(0, math.floor(amount - est / period)), reset, retry
end

-- available is what s holds at now.
local function available(s, alg, amount, burst, period, now)
  if alg ~= 2 then
    return tokens(s, alg, amount, burst, period, math.max(now, last(s, alg)))
  end
  roll(s, period, now)
  local left = math.max(s.t + period - now, 0)
  return math.max(0, amount - (s.b * left / period + s.a))
end
