-- Release a reservation (one already reaped takes its reaped spend back). ARGV: rid, done_ttl
-- -> 1 if a reservation was dropped or un-reaped
local done = P .. ':done:' .. ARGV[1]
if redis.call('EXISTS', done) == 1 then return 0 end
local dropped = drop(ARGV[1])
if unreap(ARGV[1]) > 0 then dropped = 1 end
redis.call('SET', done, 'released', 'EX', tonumber(ARGV[2]))
return dropped
