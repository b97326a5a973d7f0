-- arena: wrk over a list of paths, as wrk_quota.lua over one (a fixed number of completed
-- requests, then exact figures on one ARENA-JSON line), plus:
--   * the paths come from a file, one per line, and are requested in order, cycling: the k-th
--     request wrk sends (k = 1, 2, ...) is line ((k - 1) mod n) + 1, whichever connection
--     sends it;
--   * every answer whose status is not 2xx is counted ("non_2xx"); wrk itself counts only
--     statuses of 400 and above.
-- Arguments (after --): quota, connections, the path file. One thread, as wrk_quota.lua;
-- request() is called once before the run to check the script (not sent), hence sent = -1.
local ffi = require("ffi")
ffi.cdef[[ int kill(int pid, int sig); int getpid(void); ]]

local quota, conns = 0, 0
local reqs, n = {}, 0
sent = -1     -- globals, so that done() can read them through thread:get()
non2xx = 0
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  quota = tonumber(args[1]) or 0
  conns = tonumber(args[2]) or 0
  for line in io.lines(args[3]) do
    if line ~= "" then
      n = n + 1
      reqs[n] = wrk.format(nil, line)
    end
  end
  if n == 0 then
    error("no paths in " .. args[3])
  end
end

function request()
  sent = sent + 1
  if quota > 0 and sent == quota + conns then
    wrk.thread:stop()
    ffi.C.kill(ffi.C.getpid(), 2)
  end
  return reqs[((sent - 1) % n) + 1]
end

function response(status, headers, body)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
  end
end

function done(summary, latency, requests)
  local total_sent, total_non2xx = 0, 0
  for _, t in ipairs(threads) do
    total_sent = total_sent + (t:get("sent") or 0)
    total_non2xx = total_non2xx + (t:get("non2xx") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'ARENA-JSON {"requests": %d, "sent": %d, "bytes": %d, "duration_us": %d, "non_2xx": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "max": %d, "mean": %.1f}}\n',
    summary.requests, total_sent, summary.bytes, summary.duration, total_non2xx,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
