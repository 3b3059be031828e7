-- Give back a probe's lease. ARGV: lease, now_ms -> {1, before, view...}
redis.call('ZREM', KEYS[6], ARGV[1])
local before = redis.call('GET', KEYS[1]) or 'closed'
return {1, before, unpack(view(tonumber(ARGV[2])))}
