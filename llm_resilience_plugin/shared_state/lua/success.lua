-- Record a success. ARGV: generation, probe(0/1), lease, success_threshold, now_ms, ttl
-- -> {applied, before, view...}
local now = tonumber(ARGV[5])
local before = redis.call('GET', KEYS[1]) or 'closed'
if ARGV[2] == '1' then redis.call('ZREM', KEYS[6], ARGV[3]) end
redis.call('SET', KEYS[9], 0)  -- any answer ends a streak of 429s
if tonumber(redis.call('GET', KEYS[5]) or '0') ~= tonumber(ARGV[1]) then
  return {0, before, unpack(view(now))}
end
if ARGV[2] == '1' then
  if before == 'half-open' and redis.call('INCR', KEYS[3]) >= tonumber(ARGV[4]) then
    redis.call('SET', KEYS[1], 'closed')
    redis.call('SET', KEYS[2], 0)
    redis.call('SET', KEYS[3], 0)
    redis.call('INCR', KEYS[5])
    redis.call('DEL', KEYS[6])
    redis.call('SET', KEYS[8], 0)  -- closed: the next opening starts short again
  end
elseif before == 'closed' then
  redis.call('SET', KEYS[2], 0)
end
touch(tonumber(ARGV[6]))
return {1, before, unpack(view(now))}
