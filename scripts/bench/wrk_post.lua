-- wrk script for scripts/bench.sh: POST a chat body and print one machine-readable
-- summary line. Environment:
--   BENCH_BODY_FILE  path of the JSON request body (required)
--   BENCH_TOKENS     value of x-mock-tokens (output tokens the mock generates; default 16)
--   BENCH_DELAY_MS   if > 0, each connection waits this long before each request: with
--                    C connections that paces the load at about C*1000/BENCH_DELAY_MS
--                    requests/s (wrk itself has no rate option; latency is measured from
--                    the write of each request, so the wait is not counted).
--   BENCH_API_KEY    if set, sent as `Authorization: Bearer <key>` (the gateway runs with
--                    the auth plugin)
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
local api_key = os.getenv("BENCH_API_KEY")
if api_key ~= nil and api_key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. api_key
end

local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "0") or 0
if delay_ms > 0 then
  function delay()
    return delay_ms
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d bytes=%d p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d mean_us=%.1f err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean,
    e.connect, e.read, e.write, e.status, e.timeout))
end
