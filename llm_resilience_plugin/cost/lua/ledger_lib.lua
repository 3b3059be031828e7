-- Shared by every ledger script (prepended to each). KEYS[1] is the prefix (a string, not a key);
-- data keys are derived from it (money in integer nano-dollars):
--   {p}:k:{id} HASH budget scope win limit spent reserved exp
--   {p}:keys SET of key ids; {p}:kexp ZSET id -> expires_at
--   {p}:r:{rid} HASH keys(json) amount exp; {p}:rexp ZSET rid -> expires_at
--   {p}:done:{rid} 'settled'|'released' (TTL) - makes settle/release replays idempotent
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
local function reap(now, limit)
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', P .. ':rexp', '-inf', now, 'LIMIT', 0, limit)) do
    drop(rid)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. ':kexp', '-inf', now, 'LIMIT', 0, limit)) do
    local k = P .. ':k:' .. id
    if tonumber(redis.call('HGET', k, 'reserved') or '0') <= 0 then
      redis.call('DEL', k, P .. ':a:' .. id)
      redis.call('SREM', P .. ':keys', id)
      redis.call('ZREM', P .. ':kexp', id)
    end
  end
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
