-- Record a failure. ARGV: generation, probe(0/1), lease, fail_max, now_ms, ttl
-- -> {applied, before, view...}
local now = tonumber(ARGV[5])
local before = redis.call('GET', KEYS[1]) or 'closed'
if ARGV[2] == '1' then redis.call('ZREM', KEYS[6], ARGV[3]) end
if tonumber(redis.call('GET', KEYS[5]) or '0') ~= tonumber(ARGV[1]) then
  return {0, before, unpack(view(now))}
end
if ARGV[2] == '1' then
  if before == 'half-open' then trip(now) end
elseif before == 'closed' then
  if redis.call('INCR', KEYS[2]) >= tonumber(ARGV[4]) then trip(now) end
end
touch(tonumber(ARGV[6]))
return {1, before, unpack(view(now))}
