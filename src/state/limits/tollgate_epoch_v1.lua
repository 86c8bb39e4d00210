-- tollgate_epoch_v1: the limiter store's epoch, a hash that lives as long as the store keeps
-- its data. When it is missing the store lost everything (a restart without persistence, a
-- failover to an empty replica, a flush): create it with the caller's id and a recovery
-- deadline; gated checks wait until then while every gateway registers its running leases
-- again (decision 202).
-- KEYS: the epoch hash. ARGV: a new epoch id, the recovery deadline in ms.
-- Returns the epoch id in force. (A gateway's first call instead sets the `epoch` field alone,
-- with `HSETNX`: it holds no lease, and the store may simply be new, so no recovery.)
local e = redis.call('HGET', KEYS[1], 'epoch')
if e then return e end
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'until', ARGV[2])
return ARGV[1]
