-- Read the state. ARGV: now_ms -> {1, before, view...}
local before = redis.call('GET', KEYS[1]) or 'closed'
return {1, before, unpack(view(tonumber(ARGV[1])))}
