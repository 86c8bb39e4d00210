-- wrk script for scripts/bench.py: POST a chat body and print one machine-readable
-- summary line. Environment:
--   BENCH_BODY_FILE  path of the JSON request body (required)
--   BENCH_TOKENS     value of x-mock-tokens (output tokens the mock generates; default 16)
--   BENCH_DELAY_MS   if > 0, each connection waits this long before each request: with
--                    C connections that paces the load at about C*1000/BENCH_DELAY_MS
--                    requests/s (wrk itself has no rate option; latency is measured from
--                    the write of each request, so the wait is not counted).
--   BENCH_EXTRA_HEADER  if set, one more header, `name: value` (an upstream shape's knob)
--   BENCH_API_KEY    if set, sent as `Authorization: Bearer <key>` (the gateway runs with
--                    the auth plugin)
--   BENCH_HONOR_RETRY_AFTER  if 1, a connection answered 429 or 503 with `Retry-After`
--                    waits that long (plus up to 25% jitter) before its next request, as the
--                    official clients do; the summary then counts those answers (`shed=`).
--                    Without it every connection sends again at once, as wrk always does.
local path = os.getenv("BENCH_BODY_FILE")
if path == nil then
  error("BENCH_BODY_FILE is not set")
end
local f = assert(io.open(path, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-mock-tokens"] = os.getenv("BENCH_TOKENS") or "16"
local extra = os.getenv("BENCH_EXTRA_HEADER")
if extra ~= nil and extra ~= "" then
  local name, value = extra:match("^([^:]+):%s*(.*)$")
  wrk.headers[name] = value
end
local api_key = os.getenv("BENCH_API_KEY")
if api_key ~= nil and api_key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. api_key
end

local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "0") or 0
local honor = os.getenv("BENCH_HONOR_RETRY_AFTER") == "1"
if delay_ms > 0 and not honor then
  function delay()
    return delay_ms
  end
end

-- wrk calls delay() for a connection right after its response() ran, so a wait set by
-- response() applies to that same connection's next request.
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
if honor then
  shed = 0
  local wait_next = 0
  function response(status, headers, body)
    if status == 429 or status == 503 then
      shed = shed + 1
      local ra = tonumber(headers["Retry-After"] or headers["retry-after"] or "")
      if ra ~= nil then
        wait_next = ra * 1000 * (1 + math.random() * 0.25)
      end
    end
  end
  function delay()
    local d = wait_next
    wait_next = 0
    return math.max(d, delay_ms)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local shed_total = 0
  for _, t in ipairs(threads) do
    shed_total = shed_total + (t:get("shed") or 0)
  end
  io.write(string.format(
    "BENCH requests=%d duration_us=%d bytes=%d p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d mean_us=%.1f err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d shed=%d\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean,
    e.connect, e.read, e.write, e.status, e.timeout, shed_total))
end
