-- tollgate_renew_v2: push a running request's lease expiry on every gate it holds, atomically,
-- and put it back on any gate where it is missing or expired: the store lost it (a restart
-- without persistence, a failover) or it expired while its gateway could not reach the store.
-- The request is still running, so it is counted again even when that puts a gate over its
-- limit; admission then refuses until enough running requests end (decision 202). v1 dropped
-- such a lease instead, so its request went uncounted until it ended.
-- KEYS: the lease's gate sorted sets. ARGV: now_ms, ttl_ms, lease_id.
-- Returns {new expiry in ms, number of gates the lease was put back on}.
local now, ttl, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local restored = 0
for i = 1, #KEYS do
  local score = redis.call('ZSCORE', KEYS[i], lease)
  if (not score) or tonumber(score) <= now then restored = restored + 1 end
  redis.call('ZADD', KEYS[i], now + ttl, lease)
  if redis.call('PTTL', KEYS[i]) < ttl + 1000 then redis.call('PEXPIRE', KEYS[i], ttl + 1000) end
end
return { now + ttl, restored }
