-- Reap expired reservations (into spend) and drop idle keys. ARGV: now, reaped_ttl -> 1
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local before = -1
while before ~= 0 do
  before = redis.call('ZCOUNT', P .. ':rexp', '-inf', now)
           + redis.call('ZCOUNT', P .. ':kexp', '-inf', now)
  reap(now, 1000, ttl)
  local after = redis.call('ZCOUNT', P .. ':rexp', '-inf', now)
                + redis.call('ZCOUNT', P .. ':kexp', '-inf', now)
  if after >= before then break end
end
return 1
