"""c10k: 10,000 idle keep-alive connections (each served one request, then held) while 100
active connections run wrk; server memory per idle connection, throughput and p99 of the
active ones, and whether a brand-new connection is still served.

Variants (`--tls`, `--h2`): the idle connections are TLS connections (HTTP/1.1, or HTTP/2
with their one request as a stream), the active load is wrk over https or h2load over h2
with one stream per connection (the same 100 requests in flight), and the new connection
speaks the same protocol. An idle TLS connection holds the server's TLS state, and an idle
HTTP/2 one its HTTP/2 session as well: the memory slope is what that costs."""

from __future__ import annotations

import time

from arena import probe
from arena.clients import h2load, wrk
from arena.clients.idle import fetch_once
from arena.clients.idle_holder import IdleHolder
from arena.measure import tree_memory
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point, Scenario, record, sampled
from arena.servers.base import RunningServer, SiteOptions

PATH = "/index.html"
# How long the idle connections sit before their memory is read.
IDLE_SETTLE_SECONDS = 3.0


@register
class C10k(Scenario):
    name = "c10k"
    title = "c10k: 10,000 idle keep-alive connections held while 100 active ones run"
    study = "S1's future work (10,000 concurrent connections); idle-connection method of BENCHMARKING.md"
    description = ("10,000 keep-alive connections each served one request then held idle; 100 active "
                   "connections run wrk (100,000 requests of the small page) meanwhile; then one new "
                   "connection.")
    tools = ["wrk", "h2load"]
    transports = ("http", "tls", "h2")
    x_label = "idle connections"
    study_columns = [("Idle connections", "idle"), ("Held", "idle_held"),
                     ("Memory / idle conn (B)", "mem_per_conn_b"), ("Still open at end", "idle_still_open"),
                     ("Active", "active"),
                     ("Req/s (active)", "rps"), ("p99 ms (active)", "p99_ms"),
                     ("New connection served", "fresh_ok"), ("Failed responses", "failures")]

    def _sizes(self, options: Options) -> tuple[int, int, int]:
        if options.quick:
            return 1000, 10, options.requests or 2000
        return 10_000, 100, options.requests or 100_000

    def __init__(self) -> None:
        super().__init__()
        self._memory_read: set[int] = set()

    def site_options(self, options: Options) -> SiteOptions:
        idle, active, _ = self._sizes(options)
        # Idle connections must outlive the whole point, so the keep-alive timeout is long.
        return SiteOptions(connections=idle + active + 64, keepalive_timeout=300)

    def points(self, options: Options) -> list[Point]:
        idle, active, requests = self._sizes(options)
        key = f"idle{idle}/active{active}"
        if options.transport != "http":
            return [Point(key=f"{options.transport}/{key}", series=f"c10k {options.transport}", x=idle,
                          params={"idle": idle, "active": active, "requests": requests, "path": PATH,
                                  "protocol": "h2" if options.transport == "h2" else "https/1.1"})]
        return [Point(key=key, series="c10k", x=idle,
                      params={"idle": idle, "active": active, "requests": requests, "path": PATH})]

    def probe_paths(self) -> list[str]:
        return [PATH]

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        """Memory per idle connection is a slope: the server's PSS with a tenth of the idle
        connections open and settled, then with all of them, divided by the difference.
        Baseline, warm-up leftovers and allocator trimming cancel out, which a reading
        against a pre-run baseline does not do (it came out negative for some servers)."""
        p = point.params
        opts = ctx.options
        first = max(1, p["idle"] // 10)
        open_seconds = 20 if opts.quick else 60

        transport = opts.transport
        cafile = str(ctx.cert) if ctx.cert else None

        def hold(n: int) -> IdleHolder:
            return IdleHolder(server.site.host, server.site.port, p["path"], n, opts.client_cpus,
                              open_seconds=open_seconds, hold_seconds=600, transport=transport, cafile=cafile)

        def active():
            if transport == "h2":
                return h2load.run(server.url(p["path"]), p["active"], p["requests"], opts.client_cpus,
                                  tick=ctx.tick, http2=True)
            return wrk.run(server.url(p["path"]), p["active"], p["requests"], opts.client_cpus, tick=ctx.tick)

        holders = [hold(first)]
        try:
            ready_first = holders[0].wait_ready()
            # Memory is read once the connections are idle, not in the instant the last
            # one was answered: a server may release per-connection state a moment after
            # a request (gannet parks connections idle for 1 s). Peak memory over the whole
            # point is reported separately, so the burst is not hidden.
            time.sleep(IDLE_SETTLE_SECONDS)
            before = tree_memory(server.pid)
            holders.append(hold(p["idle"] - first))
            ready_rest = holders[1].wait_ready()
            time.sleep(IDLE_SETTLE_SECONDS)
            after = tree_memory(server.pid)
            result, tool, failure, sample = sampled(server, active)
            if transport == "h2":
                fresh_ok = fetch_once(server.site.host, server.site.port, p["path"], transport, cafile)
            else:
                try:
                    fresh = probe.get(server.site.host, server.site.port, p["path"], close=True, timeout=5,
                                      context=server.site.client_tls())
                    fresh_ok = fresh.status == 200
                except OSError:
                    fresh_ok = False
        finally:
            still = [h.release() for h in holders]
        still_open = None if None in still else sum(still)
        ready = {
            "served": (ready_first.get("served") or 0) + (ready_rest.get("served") or 0),
            "failed": (ready_first.get("failed") or 0) + (ready_rest.get("failed") or 0),
            "errors": {**(ready_first.get("errors") or {}), **(ready_rest.get("errors") or {})},
        }
        added = ready_rest.get("served") or 0
        # Only a server's first round reads its memory growth: in later rounds the same
        # process reuses the heap the first round grew, which hides the connections' cost.
        if server.pid in self._memory_read:
            added = 0
        self._memory_read.add(server.pid)
        probed = server.probes.get(p["path"], {})
        rec = record(result, tool, failure, sample, body_size=ctx.files["index.html"],
                     header_range=(probed["header_min"], probed["header_max"]) if probed else None)
        served = ready.get("served") or 0
        rec.update({
            "idle_held": served,
            "idle_failed": ready.get("failed"),
            "idle_errors": ready.get("errors"),
            "idle_still_open": still_open,
            "mem_per_conn_b": (after.pss_kib - before.pss_kib) * 1024 / added if added else None,
            "rss_per_conn_b": (after.rss_kib - before.rss_kib) * 1024 / added if added else None,
            "fresh_ok": 1 if fresh_ok else 0,
        })
        # Idle connections the server refused or dropped are failed responses too, and so are
        # the active requests that never got an answer within wrk's time bound (a server out
        # of connections leaves wrk waiting instead of erroring).
        unanswered = max(0, p["requests"] - (result.requests or 0))
        rec["failures"] = (rec["failures"] or 0) + (ready.get("failed") or 0) + (0 if fresh_ok else 1) + unanswered
        return rec
