-- Record a 429. ARGV: generation, probe(0/1), lease, rate_limit_fail_max, now_ms, ttl
-- -> {tripped, before, view...}. Fewer than the threshold in a row (fleet-wide, no success in
-- between) only free the probe slot; the threshold opens the breaker (a probe's 429 re-opens it).
local now = tonumber(ARGV[5])
local before = redis.call('GET', KEYS[1]) or 'closed'
if ARGV[2] == '1' then redis.call('ZREM', KEYS[6], ARGV[3]) end
local n = redis.call('INCR', KEYS[9])
if n < tonumber(ARGV[4]) then
  touch(tonumber(ARGV[6]))
  return {0, before, unpack(view(now))}
end
redis.call('SET', KEYS[9], 0)
local tripped = 0
if tonumber(redis.call('GET', KEYS[5]) or '0') == tonumber(ARGV[1]) then
  if before == 'closed' or (ARGV[2] == '1' and before == 'half-open') then
    trip(now)
    tripped = 1
  end
end
touch(tonumber(ARGV[6]))
return {tripped, before, unpack(view(now))}
