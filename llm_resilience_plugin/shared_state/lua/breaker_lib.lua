-- Shared by every breaker script (prepended to each). KEYS: 1 state, 2 fail_counter,
-- 3 success_counter, 4 opened_at (whole seconds, as pybreaker's CircuitRedisStorage writes it),
-- 5 generation, 6 probes (ZSET lease -> expiry ms), 7 opened_at_ms, 8 streak (trips in a row
-- without closing: each one doubles the open window), 9 rate_limited (429s in a row, fleet-wide).
-- Times are the caller's wall clock in ms (so injected clocks work).
local function view(now)
  local st = redis.call('GET', KEYS[1]) or 'closed'
  return {st, tonumber(redis.call('GET', KEYS[5]) or '0'),
          tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(redis.call('GET', KEYS[3]) or '0'),
          tonumber(redis.call('GET', KEYS[7]) or '0'),
          redis.call('ZCOUNT', KEYS[6], '(' .. now, '+inf'),
          tonumber(redis.call('GET', KEYS[8]) or '0'), tonumber(redis.call('GET', KEYS[9]) or '0')}
end
local function touch(ttl)
  for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
end
local function trip(now)
  redis.call('SET', KEYS[1], 'open')
  redis.call('SET', KEYS[7], now)
  redis.call('SET', KEYS[4], math.floor(now / 1000))
  redis.call('INCR', KEYS[5])
  redis.call('SET', KEYS[3], 0)
  redis.call('DEL', KEYS[6])
  redis.call('INCR', KEYS[8])
end
-- How long the current opening lasts: first_ms doubled per trip in a row after the first, at most cap_ms.
local function window(first, cap)
  local streak = tonumber(redis.call('GET', KEYS[8]) or '1')
  if streak < 1 then streak = 1 end
  local w = first * math.pow(2, math.min(streak - 1, 40))
  if w > cap then w = cap end
  return w
end
