-- wrk script for `cgnmt serve`: each request translates the next sentence of a file (one sentence a request),
-- cycling through it. Usage (see scripts/bench_serve.py for the whole comparison):
--   SENTENCES=test.zh wrk -t2 -c64 -d20s -s scripts/bench_serve.lua http://127.0.0.1:PORT/v1/translate
local bodies = {}
local function escape(s)
  return (s:gsub('\\', '\\\\'):gsub('"', '\\"'))
end
for line in io.lines(os.getenv("SENTENCES")) do
  bodies[#bodies + 1] = '{"sentences": ["' .. escape(line) .. '"]}'
end
local k = 0
function request()
  k = k % #bodies + 1
  return wrk.format("POST", nil, { ["Content-Type"] = "application/json" }, bodies[k])
end
function done(summary, latency, requests)
  io.write(string.format("requests %d, errors %d, p50 %.1f ms, p99 %.1f ms\n", summary.requests,
    summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
