-- tollgate_check_v3: one admission check, atomically. Windows, then concurrency gates, then
-- tokens per minute; nothing is recorded unless every part passes. A changed script gets a new
-- name (v3, ...); gateways of two versions share keys only when each counts the other's writes
-- exactly, as v1 and v2 do (below).
--
-- KEYS: nw window hashes, ng gate sorted sets, the tokens hash when has_tpm = 1, then the
--       store's epoch hash (`tollgate_epoch_v1.lua`).
-- ARGV: now_ms, nw, ng, has_tpm, lease_id, lease_ttl_ms, recovery_ms,
--       nw window limits, ng gate limits, then tokens and the tokens limit when has_tpm = 1.
--
-- v3 adds the recovery (decision 202): a gated check on a store without its epoch (it lost
-- its data) creates the epoch with a recovery deadline, and gated checks answer 4 until then
-- while every gateway registers its running leases again. v2 gateways do not read the epoch;
-- both versions count the same keys the same way.
--
-- Windows and tokens: a hash per key, field = second (floor(now_ms / 1000)), value = amount.
-- Second s is counted while floor(now / 1000) <= s + 60, so an entry counts for more than 60
-- and at most 61 seconds; older fields are deleted as they are met.
-- v2 keeps two summary fields beside the seconds: TOTAL, the sum of the counted seconds, and
-- OLDEST, the oldest counted second. While OLDEST is still counted every second is, so the
-- total is TOTAL and the hash is not read whole; once OLDEST has left, the hash is read whole
-- once (about once a second for a busy key), the stale seconds deleted and the summary
-- written again. A refusal reads the hash whole to say when enough leaves. The summary's
-- field names are negative numbers, so a v1 gateway sharing the hash (a rolling upgrade)
-- takes them for stale seconds and deletes them, and the next v2 check reads the hash whole:
-- the two versions count the same window exactly, v2 only slower while v1 is about.
-- Gates: a sorted set per key, member = lease id, score = expiry in ms; a lease is alive while
-- now < score, and expired members are removed before counting, so the slots of a gateway that
-- died free within the lease TTL.
--
-- Returns integers only:
--   {0, count_1, oldest_second_1, ..., count_nw, oldest_second_nw, in_use_1, ..., in_use_ng}
--   {1, window_index, counted, retry_after_ms}
--   {2, gate_index, in_use, retry_after_ms}
--   {3, used_tokens, retry_after_ms, never}
--   {4, retry_after_ms}                  (recovering: the store lost its data)
local now = tonumber(ARGV[1])
local nw, ng, has_tpm = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lease, ttl, recovery = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local A = 7 -- the last fixed ARGV; the limits follow
local SPAN = 60
local CAP = 8000
local cur = math.floor(now / 1000)
local first_counted = cur - SPAN
local TOTAL, OLDEST = '-1', '-2'

-- Counted buckets of a hash as {second, amount} (the summary's negative names are never counted).
local function buckets(key)
  local flat = redis.call('HGETALL', key)
  local list = {}
  for i = 1, #flat, 2 do
    local sec = tonumber(flat[i])
    if sec ~= nil and sec >= first_counted then list[#list + 1] = { sec, tonumber(flat[i + 1]) } end
  end
  return list
end

-- Counted total of a bucket hash and its oldest counted second (nil when empty).
local function load(key)
  local s = redis.call('HMGET', key, TOTAL, OLDEST)
  local n, o = tonumber(s[1]), tonumber(s[2])
  if n ~= nil and o ~= nil and o >= first_counted then return n, o end
  local flat = redis.call('HGETALL', key)
  local total, stale, oldest = 0, {}, nil
  for i = 1, #flat, 2 do
    local sec = tonumber(flat[i])
    if sec ~= nil and sec >= 0 then
      if sec < first_counted then
        stale[#stale + 1] = flat[i]
      else
        total = total + tonumber(flat[i + 1])
        if oldest == nil or sec < oldest then oldest = sec end
      end
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  if oldest == nil then
    redis.call('HDEL', key, TOTAL, OLDEST)
  else
    redis.call('HSET', key, TOTAL, total, OLDEST, oldest)
  end
  return total, oldest
end

-- Milliseconds until at least `need` counted units have left the window.
local function wait_for(list, need)
  table.sort(list, function(a, b) return a[1] < b[1] end)
  local freed, last = 0, cur
  for _, b in ipairs(list) do
    freed = freed + b[2]
    last = b[1]
    if freed >= need then break end
  end
  return (last + SPAN + 1) * 1000 - now
end

-- (0) Gates need the running leases of every gateway: none while the store recovers.
if ng > 0 then
  local epoch = KEYS[nw + ng + has_tpm + 1]
  local e = redis.call('HMGET', epoch, 'epoch', 'until')
  local until_ms = tonumber(e[2]) or 0
  if not e[1] then
    until_ms = now + recovery
    redis.call('HSET', epoch, 'epoch', lease .. '@' .. now, 'until', until_ms)
  end
  if until_ms > now then return { 4, until_ms - now } end
end

-- (1) Windows, in order.
local windows, oldests = {}, {}
for i = 1, nw do
  local limit = tonumber(ARGV[A + i])
  local n, oldest = load(KEYS[i])
  if n + 1 > limit then
    return { 1, i - 1, n, wait_for(buckets(KEYS[i]), n + 1 - limit) }
  end
  oldests[i] = oldest
  windows[#windows + 1] = n
  windows[#windows + 1] = math.min(oldest or cur, cur)
end

-- (2) Gates, in order. A lease already alive on a full gate (the same check repeated) keeps
-- its slot.
local counted = {}
for j = 1, ng do
  local key, limit = KEYS[nw + j], tonumber(ARGV[A + nw + j])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local n = redis.call('ZCARD', key)
  if n >= limit and not redis.call('ZSCORE', key, lease) then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    local wait = CAP
    if first[2] then wait = math.min(CAP, tonumber(first[2]) - now) end
    return { 2, j - 1, n, wait }
  end
  counted[j] = n
end

-- (3) Tokens per minute.
local tokens, tkey, toldest = 0, nil, nil
if has_tpm == 1 then
  tkey = KEYS[nw + ng + 1]
  tokens = tonumber(ARGV[A + nw + ng + 1])
  local limit = tonumber(ARGV[A + nw + ng + 2])
  local used
  used, toldest = load(tkey)
  if tokens > limit then return { 3, used, 0, 1 } end
  if used + tokens > limit then
    return { 3, used, math.min(CAP, wait_for(buckets(tkey), used + tokens - limit)), 0 }
  end
end

-- Everything passed: record. Key TTLs only collect idle keys; the scores and fields decide.
-- A bucket hash's TTL is set when a new second starts (its newest field is then counted for at
-- most 61 s); 65 s leaves room for gateway clock skew.
local BUCKETS_TTL = (SPAN + 5) * 1000
-- Count `amount` in this second, keeping the summary (`oldest` as load read it).
local function record(key, amount, oldest)
  if redis.call('HINCRBY', key, cur, amount) == amount then redis.call('PEXPIRE', key, BUCKETS_TTL) end
  redis.call('HINCRBY', key, TOTAL, amount)
  if oldest == nil or cur < oldest then redis.call('HSET', key, OLDEST, cur) end
end
for i = 1, nw do
  record(KEYS[i], 1, oldests[i])
end
-- A key named by two gates is written once; in_use counts this lease once on both.
local added, in_use = {}, {}
for j = 1, ng do
  local key = KEYS[nw + j]
  if added[key] == nil then
    added[key] = redis.call('ZADD', key, now + ttl, lease)
    if redis.call('PTTL', key) < ttl + 1000 then redis.call('PEXPIRE', key, ttl + 1000) end
  end
  in_use[j] = counted[j] + added[key]
end
if tkey and tokens > 0 then
  record(tkey, tokens, toldest)
end

local reply = { 0 }
for _, v in ipairs(windows) do reply[#reply + 1] = v end
for j = 1, ng do reply[#reply + 1] = in_use[j] end
return reply
