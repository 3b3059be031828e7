-- Settle (one already reaped replaces the estimate it was reaped at). ARGV: rid, units,
-- done_ttl, entry ts ('' = no entry), entry member, n, then n x (id budget scope win limit exp)
-- -> {applied(1|0), rows...} with 6 fields per key
local rid, units, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[6])
local done = P .. ':done:' .. rid
local applied = 1
if redis.call('GET', done) == 'settled' then
  applied = 0
else
  drop(rid)
  unreap(rid)  -- reaped already: its estimate (spend and log entry) is taken back first
end
local out = {applied}
for j = 1, n do
  local i = 7 + (j - 1) * 6
  local k = upsert(i)
  if applied == 1 then redis.call('HINCRBY', k, 'spent', units) end
  for _, v in ipairs(row(k)) do out[#out + 1] = v end
end
if applied == 1 then
  if ARGV[4] ~= '' then redis.call('ZADD', P .. ':log', ARGV[4], ARGV[5]) end
  redis.call('SET', done, 'settled', 'EX', tonumber(ARGV[3]))
end
return out
