-- Release a reservation. ARGV: rid, done_ttl -> 1 if a reservation was dropped
local done = P .. ':done:' .. ARGV[1]
if redis.call('EXISTS', done) == 1 then return 0 end
local dropped = drop(ARGV[1])
redis.call('SET', done, 'released', 'EX', tonumber(ARGV[2]))
return dropped
