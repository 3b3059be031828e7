-- Drop expired reservations and idle keys. ARGV: now -> 1
local now = tonumber(ARGV[1])
local before = -1
while before ~= 0 do
  before = redis.call('ZCOUNT', P .. ':rexp', '-inf', now)
           + redis.call('ZCOUNT', P .. ':kexp', '-inf', now)
  reap(now, 1000)
  local after = redis.call('ZCOUNT', P .. ':rexp', '-inf', now)
                + redis.call('ZCOUNT', P .. ':kexp', '-inf', now)
  if after >= before then break end
end
return 1
