-- tollgate_renew_v1: push a lease's expiry on every gate it holds, atomically.
-- KEYS: the lease's gate sorted sets. ARGV: now_ms, ttl_ms, lease_id.
-- Returns the new expiry in ms, or -1 when the lease had expired (or was released) on any
-- gate: then it is removed from all of them, since its slots may already have been taken.
local now, ttl, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i = 1, #KEYS do
  local score = redis.call('ZSCORE', KEYS[i], lease)
  if (not score) or tonumber(score) <= now then
    for j = 1, #KEYS do redis.call('ZREM', KEYS[j], lease) end
    return -1
  end
end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + ttl, lease)
  if redis.call('PTTL', KEYS[i]) < ttl + 1000 then redis.call('PEXPIRE', KEYS[i], ttl + 1000) end
end
return now + ttl
