-- arena: make wrk stop after a fixed number of completed requests, and print exact figures.
--
-- wrk only knows durations. Each connection has one request in flight, so when request()
-- is called for the (quota + connections)-th time exactly `quota` responses have completed:
-- the thread stops its loop and sends SIGINT to wrk, whose main thread then stops waiting
-- for the duration and prints its report. Counting in request() keeps response bodies out
-- of Lua (a response() callback would copy every 394 KB body).
-- Arguments (after --): quota and connections, per thread. The arena runs one thread; wrk
-- calls that thread's request() once before the run to check the script (it is not sent),
-- hence `sent` starts at -1.
local ffi = require("ffi")
ffi.cdef[[ int kill(int pid, int sig); int getpid(void); ]]

local quota, conns, req = 0, 0, nil
sent = -1  -- global so that done() can read it through thread:get()
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  quota = tonumber(args[1]) or 0
  conns = tonumber(args[2]) or 0
  req = wrk.format()
end

function request()
  sent = sent + 1
  if quota > 0 and sent == quota + conns then
    wrk.thread:stop()
    ffi.C.kill(ffi.C.getpid(), 2)
  end
  return req
end

function done(summary, latency, requests)
  local total_sent = 0
  for _, t in ipairs(threads) do
    total_sent = total_sent + (t:get("sent") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'ARENA-JSON {"requests": %d, "sent": %d, "bytes": %d, "duration_us": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "max": %d, "mean": %.1f}}\n',
    summary.requests, total_sent, summary.bytes, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
