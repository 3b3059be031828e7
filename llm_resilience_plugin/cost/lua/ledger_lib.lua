-- Shared by every ledger script (prepended to each). KEYS[1] is the prefix (a string, not a key);
-- data keys are derived from it (money in integer nano-dollars):
--   {p}:k:{id} HASH budget scope win limit spent reserved exp
--   {p}:keys SET of key ids; {p}:kexp ZSET id -> expires_at
--   {p}:r:{rid} HASH keys(json) amount exp ts member; {p}:rexp ZSET rid -> expires_at
--   {p}:done:{rid} 'settled'|'released' (TTL) - makes settle/release replays idempotent
--   {p}:reaped:{rid} HASH keys amount member (TTL) - a reaped reservation, until its late
--     settle/release replaces the estimate it was settled at
--   {p}:log ZSET ts -> "{rid}|{json entry}"; {p}:a:{id} SET of alert thresholds fired
local P = KEYS[1]
local function drop(rid)
  local r = P .. ':r:' .. rid
  local ids = redis.call('HGET', r, 'keys')
  if not ids then redis.call('ZREM', P .. ':rexp', rid) return 0 end
  local amount = tonumber(redis.call('HGET', r, 'amount'))
  for _, id in ipairs(cjson.decode(ids)) do
    local k = P .. ':k:' .. id
    if redis.call('EXISTS', k) == 1 then
      local left = tonumber(redis.call('HGET', k, 'reserved') or '0') - amount
      if left < 0 then left = 0 end
      redis.call('HSET', k, 'reserved', left)
    end
  end
  redis.call('DEL', r)
  redis.call('ZREM', P .. ':rexp', rid)
  return 1
end
-- add delta (may be negative) to the spend of every existing key in ids, never below 0
local function add_spent(ids, delta)
  for _, id in ipairs(ids) do
    local k = P .. ':k:' .. id
    if redis.call('EXISTS', k) == 1 and redis.call('HINCRBY', k, 'spent', delta) < 0 then
      redis.call('HSET', k, 'spent', 0)
    end
  end
end
-- A reservation past its expiry becomes spend at its amount (its process may have died after
-- sending: the provider may bill it), logged as its reaped entry; remembered for ttl seconds.
-- Returns how many were reaped and their total units.
local function reap(now, limit, ttl)
  local count, total = 0, 0
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', P .. ':rexp', '-inf', now, 'LIMIT', 0, limit)) do
    local r = P .. ':r:' .. rid
    local held = redis.call('HMGET', r, 'keys', 'amount', 'ts', 'member')
    drop(rid)
    if held[1] then
      local amount = tonumber(held[2])
      add_spent(cjson.decode(held[1]), amount)
      local member = held[4] or ''
      if member ~= '' then redis.call('ZADD', P .. ':log', held[3], member) end
      local rp = P .. ':reaped:' .. rid
      redis.call('HSET', rp, 'keys', held[1], 'amount', amount, 'member', member)
      redis.call('EXPIRE', rp, ttl)
      count = count + 1
      total = total + amount
    end
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. ':kexp', '-inf', now, 'LIMIT', 0, limit)) do
    local k = P .. ':k:' .. id
    if tonumber(redis.call('HGET', k, 'reserved') or '0') <= 0 then
      redis.call('DEL', k, P .. ':a:' .. id)
      redis.call('SREM', P .. ':keys', id)
      redis.call('ZREM', P .. ':kexp', id)
    end
  end
  return count, total
end
-- Take back a reaped reservation (its late settle or release arrived): its log entry goes and
-- its keys' spend is reduced by what it was reaped at. Returns those units (0: not reaped).
local function unreap(rid)
  local rp = P .. ':reaped:' .. rid
  local held = redis.call('HMGET', rp, 'keys', 'amount', 'member')
  if not held[1] then return 0 end
  local amount = tonumber(held[2])
  if held[3] and held[3] ~= '' then redis.call('ZREM', P .. ':log', held[3]) end
  add_spent(cjson.decode(held[1]), -amount)
  redis.call('DEL', rp)
  return amount
end
-- upsert one key from ARGV[i..i+5]: id budget scope win limit exp('' = none)
local function upsert(i)
  local id = ARGV[i]
  local k = P .. ':k:' .. id
  local exp = ARGV[i + 5]
  if redis.call('EXISTS', k) == 0 then
    redis.call('HSET', k, 'budget', ARGV[i + 1], 'scope', ARGV[i + 2], 'win', ARGV[i + 3],
               'limit', ARGV[i + 4], 'spent', 0, 'reserved', 0, 'exp', exp)
    redis.call('SADD', P .. ':keys', id)
  else
    local old = redis.call('HGET', k, 'exp') or ''
    if exp ~= '' and old ~= '' and tonumber(old) > tonumber(exp) then exp = old end
    redis.call('HSET', k, 'limit', ARGV[i + 4], 'exp', exp)
  end
  if exp == '' then redis.call('ZREM', P .. ':kexp', id) else redis.call('ZADD', P .. ':kexp', exp, id) end
  return k
end
local function row(k)
  return redis.call('HMGET', k, 'budget', 'scope', 'win', 'spent', 'reserved', 'limit')
end
