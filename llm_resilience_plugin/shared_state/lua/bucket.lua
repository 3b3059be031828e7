-- Retry budget bucket. KEYS[1] the bucket. ARGV: delta, capacity, ttl -> tokens (a string: Lua
-- numbers become integers in replies)
local cap = tonumber(ARGV[2])
local t = tonumber(redis.call('GET', KEYS[1]) or ARGV[2]) + tonumber(ARGV[1])
if t > cap then t = cap end
if t < 0 then t = 0 end
redis.call('SET', KEYS[1], tostring(t), 'EX', tonumber(ARGV[3]))
return tostring(t)
