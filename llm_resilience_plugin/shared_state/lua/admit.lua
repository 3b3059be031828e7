-- Admit a call. ARGV: now_ms, first_ms, max_probes, lease_ms, lease_id, ttl, cap_ms
-- -> {admitted, probe, before, view...}
local now = tonumber(ARGV[1])
local before = redis.call('GET', KEYS[1]) or 'closed'
if before == 'closed' then return {1, 0, before, unpack(view(now))} end
if before == 'open' then
  local oa = tonumber(redis.call('GET', KEYS[7]) or '0')
  if now < oa + window(tonumber(ARGV[2]), tonumber(ARGV[7])) then return {0, 0, before, unpack(view(now))} end
  redis.call('SET', KEYS[1], 'half-open')
  redis.call('INCR', KEYS[5])
  redis.call('SET', KEYS[3], 0)
  redis.call('DEL', KEYS[6])
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
if redis.call('ZCARD', KEYS[6]) >= tonumber(ARGV[3]) then
  if before == 'open' then touch(tonumber(ARGV[6])) end
  return {0, 0, before, unpack(view(now))}
end
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[4]), ARGV[5])
touch(tonumber(ARGV[6]))
return {1, 1, before, unpack(view(now))}
