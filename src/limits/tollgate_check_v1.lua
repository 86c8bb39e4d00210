-- tollgate_check_v1: one admission check, atomically. Windows, then concurrency gates, then
-- tokens per minute; nothing is recorded unless every part passes. A changed script gets a new
-- name (v2, ...) so gateways of two versions never share keys with different meanings.
--
-- KEYS: nw window hashes, ng gate sorted sets, then the tokens hash when has_tpm = 1.
-- ARGV: now_ms, nw, ng, has_tpm, lease_id, lease_ttl_ms,
--       nw window limits, ng gate limits, then tokens and the tokens limit when has_tpm = 1.
--
-- Windows and tokens: a hash per key, field = second (floor(now_ms / 1000)), value = amount.
-- Second s is counted while floor(now / 1000) <= s + 60, so an entry counts for more than 60
-- and at most 61 seconds; older fields are deleted as they are met.
-- Gates: a sorted set per key, member = lease id, score = expiry in ms; a lease is alive while
-- now < score, and expired members are removed before counting, so the slots of a gateway that
-- died free within the lease TTL.
--
-- Returns integers only:
--   {0, count_1, oldest_second_1, ..., count_nw, oldest_second_nw, in_use_1, ..., in_use_ng}
--   {1, window_index, counted, retry_after_ms}
--   {2, gate_index, in_use, retry_after_ms}
--   {3, used_tokens, retry_after_ms, never}
local now = tonumber(ARGV[1])
local nw, ng, has_tpm = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lease, ttl = ARGV[5], tonumber(ARGV[6])
local SPAN = 60
local CAP = 8000
local cur = math.floor(now / 1000)
local first_counted = cur - SPAN

-- Counted total of a bucket hash, its counted buckets {second, amount} and its oldest second.
local function load(key)
  local flat = redis.call('HGETALL', key)
  local total, list, stale, oldest = 0, {}, {}, nil
  for i = 1, #flat, 2 do
    local sec, n = tonumber(flat[i]), tonumber(flat[i + 1])
    if sec < first_counted then
      stale[#stale + 1] = flat[i]
    else
      total = total + n
      list[#list + 1] = { sec, n }
      if oldest == nil or sec < oldest then oldest = sec end
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  return total, list, oldest
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

-- (1) Windows, in order.
local windows = {}
for i = 1, nw do
  local limit = tonumber(ARGV[6 + i])
  local n, list, oldest = load(KEYS[i])
  if n + 1 > limit then
    return { 1, i - 1, n, wait_for(list, n + 1 - limit) }
  end
  windows[#windows + 1] = n
  windows[#windows + 1] = math.min(oldest or cur, cur)
end

-- (2) Gates, in order. A lease already alive on a full gate (the same check repeated) keeps
-- its slot.
local counted = {}
for j = 1, ng do
  local key, limit = KEYS[nw + j], tonumber(ARGV[6 + nw + j])
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
local tokens, tkey = 0, nil
if has_tpm == 1 then
  tkey = KEYS[nw + ng + 1]
  tokens = tonumber(ARGV[6 + nw + ng + 1])
  local limit = tonumber(ARGV[6 + nw + ng + 2])
  local used, list = load(tkey)
  if tokens > limit then return { 3, used, 0, 1 } end
  if used + tokens > limit then
    return { 3, used, math.min(CAP, wait_for(list, used + tokens - limit)), 0 }
  end
end

-- Everything passed: record. Key TTLs only collect idle keys; the scores and fields decide.
-- A bucket hash's TTL is set when a new second starts (its newest field is then counted for at
-- most 61 s); 65 s leaves room for gateway clock skew.
local BUCKETS_TTL = (SPAN + 5) * 1000
for i = 1, nw do
  if redis.call('HINCRBY', KEYS[i], cur, 1) == 1 then redis.call('PEXPIRE', KEYS[i], BUCKETS_TTL) end
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
  if redis.call('HINCRBY', tkey, cur, tokens) == tokens then redis.call('PEXPIRE', tkey, BUCKETS_TTL) end
end

local reply = { 0 }
for _, v in ipairs(windows) do reply[#reply + 1] = v end
for j = 1, ng do reply[#reply + 1] = in_use[j] end
return reply
