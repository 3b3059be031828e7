-- One admission against a deployment's fleet-wide rate limit: a request bucket and a token bucket
-- (continuously refilled, on Redis's own clock so no worker's clock skews them), taken together
-- or not at all. KEYS[1] requests, KEYS[2] tokens, KEYS[3] the workers seen (a sorted set).
-- ARGV: rate, burst, token rate, token burst, tokens, ttl, worker id, reserve (the share of each
-- burst a lower priority tier leaves behind for the higher ones: 0 for the highest)
-- -> {"0" | seconds until it would fit, workers seen in the last 10 s} (strings: Lua numbers
-- become integers in replies). A new bucket starts half full: what the provider has left is
-- unknown (another client of the key, a fleet restarting), and a fleet's first requests reach the
-- provider later than their slots were taken (new connections), so it is not sent a whole burst.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local trate, tburst, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local reserve = tonumber(ARGV[8]) or 0
redis.call('ZADD', KEYS[3], now, ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - 10)
redis.call('EXPIRE', KEYS[3], ttl)
local workers = redis.call('ZCARD', KEYS[3])
local function level(key, r, cap, first)
  local v = redis.call('HMGET', key, 'l', 't')
  -- new: half full (the provider's bucket may not be full, see above), the first request fitting
  local l = tonumber(v[1]) or math.max(math.min(cap, first), cap / 2)
  local at = tonumber(v[2]) or now
  if now > at then l = math.min(cap, l + (now - at) * r) end
  return l
end
local wait = 0
local l, tl
if rate > 0 then
  l = level(KEYS[1], rate, burst, 1)
  local need = 1 + reserve * math.max(0, burst - 1)
  if l < need then wait = (need - l) / rate end
end
if trate > 0 and cost > 0 then
  tl = level(KEYS[2], trate, tburst, cost)
  local need = math.min(cost, tburst)
  need = need + reserve * math.max(0, tburst - need)
  if tl < need then wait = math.max(wait, (need - tl) / trate) end
end
if wait > 0 then return {tostring(wait), tostring(workers)} end
if rate > 0 then
  redis.call('HSET', KEYS[1], 'l', tostring(l - 1), 't', tostring(now))
  redis.call('EXPIRE', KEYS[1], ttl)
end
if trate > 0 and cost > 0 then
  redis.call('HSET', KEYS[2], 'l', tostring(tl - cost), 't', tostring(now))
  redis.call('EXPIRE', KEYS[2], ttl)
end
return {"0", tostring(workers)}
