-- Shared by every breaker script (prepended to each). KEYS: 1 state, 2 fail_counter,
-- 3 success_counter, 4 opened_at (whole seconds, as pybreaker's CircuitRedisStorage writes it),
-- 5 generation, 6 probes (ZSET lease -> expiry ms), 7 opened_at_ms. Times are the caller's wall
-- clock in ms (so injected clocks work).
local function view(now)
  local st = redis.call('GET', KEYS[1]) or 'closed'
  return {st, tonumber(redis.call('GET', KEYS[5]) or '0'),
          tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(redis.call('GET', KEYS[3]) or '0'),
          tonumber(redis.call('GET', KEYS[7]) or '0'),
          redis.call('ZCOUNT', KEYS[6], '(' .. now, '+inf')}
end
local function touch(ttl)
  for i = 1, 7 do redis.call('EXPIRE', KEYS[i], ttl) end
end
local function trip(now)
  redis.call('SET', KEYS[1], 'open')
  redis.call('SET', KEYS[7], now)
  redis.call('SET', KEYS[4], math.floor(now / 1000))
  redis.call('INCR', KEYS[5])
  redis.call('SET', KEYS[3], 0)
  redis.call('DEL', KEYS[6])
end
