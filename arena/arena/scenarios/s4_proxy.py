"""S4 reverse proxies under replayed traffic: each server proxies everything to one back end
(Debian's nginx serving ad-like JSON files, with its access log on), while a generated
ad-delivery request log (arena/adtraffic.py: ad slots with per-request query strings, sync
pixels, 5 % POSTs with small bodies, three header sets) is replayed open-loop at increasing
rates. Per rate: requests planned, sent and answered 2xx; requests the back end served (from
its access log, as the study counted); loss %; latency; the proxy's CPU and memory; the peak
TCP state counts of the proxy's and back end's sockets.

Why httperf --wsesslog: it is the one Debian load tool that replays a log open-loop with each
request's own method and body (sessions start at a fixed --rate, whatever the server does, so
an overloaded proxy shows as loss, not as a slower client). h2load --rate would give
percentiles, but sends one method and one body for all requests; wrk is closed-loop. httperf
adds headers per run only, so the log is replayed by one httperf per header set, at the same
time, each at its share of the rate. Each session is one connection with one request, as many
short-lived clients of an ad server send them; so httperf's connection time is the request's
latency (connect included): its median (of the largest replayer), mean and max are reported;
httperf has no other percentiles.

Pinning: the proxy on the server CPUs (0); the replayers on the client CPUs (1); the back end
on --backend-cpus, by default the client CPUs too (the machine has 2 cores: the back end
shares the client's, which is acceptable because it serves small files and is the same for
every proxy; its peak CPU is recorded so a saturated back end shows).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from arena import adtraffic, ports, proxycount
from arena.clients import httperf
from arena.measure import Sampler
from arena.scenarios import register
from arena.scenarios.base import CLIENT_BOUND_PCT, Context, Options, Point, Scenario, record
from arena.servers import SERVERS
from arena.servers.base import RunningServer, Site, SiteOptions

SEED = 4
# The log's length: its largest header set (55 %) stays within what httperf reads from one
# session file; longer runs cycle through it.
LOG_REQUESTS = 1_800
# After the replay, let requests the proxy still holds reach the back end's log.
SETTLE_S = 0.5
TIMEOUT_S = 5


@register
class S4Proxy(Scenario):
    name = "s4-proxy"
    title = "S4 reverse proxies: a replayed ad-delivery log at increasing rates, counting lost requests"
    study = "S4 - Apache 2.4 vs Nginx as reverse proxies under real traffic (2012)"
    description = ("Each server proxies everything to one back end (Debian's nginx, ad JSON files of 200-2,000 B, "
                   "access log on) over kept upstream connections where it can. A generated ad-delivery log "
                   "(5 % POSTs, three header sets, one request per connection) is replayed open-loop by httperf "
                   "--wsesslog, one per header set, at 250 to 8,000 requests/s, 10 s each. Lost = planned minus "
                   "served by the back end (its access log). Proxy on CPU 0, httperf on CPU 1, the back end on "
                   "--backend-cpus (default: the client CPUs, shared with httperf on a 2-core machine).")
    tools = ["httperf", "ss"]
    x_label = "offered requests per second"
    study_columns = [("Rate (req/s)", "rate"), ("Planned", "planned"), ("Sent", "sent"), ("Answered 2xx", "ok"),
                     ("Served by back end", "backend_served"), ("Lost", "lost"), ("Loss %", "loss_pct"),
                     ("Median (ms)", "p50_ms"), ("Mean (ms)", "mean_ms"), ("Max CPU %", "peak_cpu_pct"),
                     ("CPU s / 10k", "cpu_per_10k"), ("Memory (PSS MiB)", "peak_pss_mib"),
                     ("TCP states (peak)", "tcp_states")]

    def __init__(self) -> None:
        super().__init__()
        self.workdir: Path | None = None
        self.backend: RunningServer | None = None
        self.sessions: dict[str, Path] = {}

    def site_options(self, options: Options) -> SiteOptions:
        port = self.backend.site.port if self.backend else 0
        return SiteOptions(kind="proxy", connections=4096,
                           app={"backend_host": ports.HOST, "backend_port": port})

    def _rates(self, options: Options) -> list[int]:
        return [50, 100] if options.quick else [250, 500, 1000, 2000, 3000, 4000, 5000, 6000, 8000]

    def prepare(self, options: Options, servers: list[str]) -> dict:
        self.workdir = Path(tempfile.mkdtemp(prefix="arena-s4-"))
        self.workdir.chmod(0o755)
        files = adtraffic.write_docroot(self.workdir / "www")
        log = adtraffic.generate(LOG_REQUESTS, SEED)
        for name, requests in adtraffic.split(log).items():
            path = self.workdir / f"sessions-{name}.txt"
            path.write_text(adtraffic.session_file(requests[:httperf.MAX_SESSIONS]))
            self.sessions[name] = path
        cpus = options.backend_cpus or options.client_cpus
        nginx = SERVERS["nginx"]
        site = Site(self.workdir / "www", ports.free_port(),
                    SiteOptions(kind="adserver", access_log=True, connections=8192))
        self.backend = nginx.start(site, self.workdir / "backend", "tuned", cpus)
        return {"backend": {"server": nginx.version(), "address": f"{site.host}:{site.port}", "cpus": cpus,
                            "files": files},
                "log": {"seed": SEED, "requests": len(log), "posts": sum(r.method == "POST" for r in log),
                        "distinct_uris": len({r.uri for r in log}),
                        "header_sets": {n: len(rs) for n, rs in adtraffic.split(log).items()}}}

    def finish(self) -> None:
        if self.backend:
            self.backend.stop()
            self.backend = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self.sessions = {}

    def points(self, options: Options) -> list[Point]:
        seconds = 2 if options.quick else 10
        return [Point(key=f"rate{rate}", series="httperf log replay", x=rate,
                      params={"rate": rate, "seconds": seconds}) for rate in self._rates(options)]

    def warmup(self, point: Point, options: Options) -> Point | None:
        if point.x != self._rates(options)[0]:
            return None
        return Point(point.key + "/warmup", point.series, point.x, {**point.params, "seconds": 1})

    def probe_paths(self) -> list[str]:
        return ["/ads/slot-01.json", "/sync.json"]

    def _runs(self, rate: int, seconds: int) -> list[tuple[str, int, float, tuple[str, ...]]]:
        """One replayer per header set, at its share of the rate."""
        runs = []
        for name, (share, headers) in adtraffic.HEADER_SETS.items():
            part = rate * share
            runs.append((str(self.sessions[name]), max(1, round(part * seconds)), part, headers))
        return runs

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        runs = self._runs(point.params["rate"], point.params["seconds"])
        planned = sum(r[1] for r in runs)
        access = self.backend.rundir / "access.log"
        offset = proxycount.log_size(access)
        proxy, backend = Sampler(server.pid).start(), Sampler(self.backend.pid).start()
        tcp = proxycount.TcpSampler({server.site.port, self.backend.site.port}).start()
        try:
            done = httperf.run_sessions(server.site.host, server.site.port, runs, ctx.options.client_cpus,
                                        TIMEOUT_S)
        finally:
            sample, backend_sample = proxy.stop(), backend.stop()
            states = tcp.stop()
        time.sleep(SETTLE_S)
        statuses = proxycount.served_since(access, offset)
        result = proxycount.combine([r[0] for r in done])
        cpu = sum(r[1].cpu_seconds for r in done)
        wall = max(r[1].wall_seconds for r in done)
        failure = next((r[2] for r in done if r[2]), None)
        rec = record(result, None, failure, sample)
        served = sum(statuses.values())
        lost, loss_pct = proxycount.loss(planned, served)
        ok = int(result.extra["status_2xx"])
        rec.update({
            "rate": point.params["rate"], "planned": planned, "ok": ok,
            # Every planned request not answered 2xx, as the client sees it.
            "failures": planned - ok,
            "backend_served": served, "backend_statuses": dict(sorted(statuses.items())),
            "lost": lost, "loss_pct": loss_pct,
            "backend_peak_cpu_pct": backend_sample.peak_cpu_percent,
            "tcp_states": states,
            "client_cpu_pct": 100.0 * cpu / wall if wall else None,
        })
        rec["client_bound"] = rec["client_cpu_pct"] is not None and rec["client_cpu_pct"] >= CLIENT_BOUND_PCT
        return rec
