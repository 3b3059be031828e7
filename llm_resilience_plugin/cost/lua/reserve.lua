-- Reserve. ARGV: rid, units, now, expires_at, n, then n x (id budget scope win limit exp),
-- then the log member to write if this reservation is reaped ('' = none), its entry ts, and
-- how long a reaped reservation is remembered
-- -> {'ok', reaped count, reaped units} | {'dup'} | {'refused', index, spent, reserved}
local rid, units, now, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local tail = 6 + n * 6
if redis.call('EXISTS', P .. ':r:' .. rid) == 1 or redis.call('EXISTS', P .. ':done:' .. rid) == 1 then
  return {'dup'}
end
local reaped, reaped_units = reap(now, 50, tonumber(ARGV[tail + 2]))
local keys, ids = {}, {}
for j = 1, n do
  local i = 6 + (j - 1) * 6
  local k = upsert(i)
  local spent = tonumber(redis.call('HGET', k, 'spent') or '0')
  local reserved = tonumber(redis.call('HGET', k, 'reserved') or '0')
  if spent + reserved + units > tonumber(ARGV[i + 4]) then
    return {'refused', j, spent, reserved}
  end
  keys[j] = k
  ids[j] = ARGV[i]
end
for j = 1, n do redis.call('HINCRBY', keys[j], 'reserved', units) end
local r = P .. ':r:' .. rid
redis.call('HSET', r, 'keys', cjson.encode(ids), 'amount', units, 'exp', ARGV[4],
           'member', ARGV[tail], 'ts', ARGV[tail + 1])
redis.call('ZADD', P .. ':rexp', ARGV[4], rid)
return {'ok', reaped, reaped_units}
