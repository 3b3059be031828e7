-- Give back tokens reserved but not used (negative: take more). KEYS[1] the token bucket.
-- ARGV: tokens, token burst, ttl -> the level (a string)
if redis.call('EXISTS', KEYS[1]) == 0 then return "" end
local l = tonumber(redis.call('HGET', KEYS[1], 'l') or ARGV[2]) + tonumber(ARGV[1])
if l > tonumber(ARGV[2]) then l = tonumber(ARGV[2]) end
redis.call('HSET', KEYS[1], 'l', tostring(l))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return tostring(l)
