-- After an outage: a breaker this process tripped locally opens the shared one too, unless the
-- fleet has already opened it since. ARGV: local_opened_at_ms, now_ms, ttl -> {merged, before, view...}
local now = tonumber(ARGV[2])
local before = redis.call('GET', KEYS[1]) or 'closed'
local oa = tonumber(redis.call('GET', KEYS[7]) or '0')
if before == 'closed' or (before == 'half-open' and oa < tonumber(ARGV[1])) then
  trip(tonumber(ARGV[1]))
  touch(tonumber(ARGV[3]))
  return {1, before, unpack(view(now))}
end
return {0, before, unpack(view(now))}
