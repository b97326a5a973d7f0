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

Client ports: every request is a new connection, so the run needs many client ports
(arena/tcptune.py): as root it widens the kernel's port range and enables TIME-WAIT reuse for
its duration, and before each point it waits until the point's connections fit. A replayer
still running at its deadline is stopped with SIGINT and the point is marked "tool stalled"
with what httperf counted: a stalled client is never counted as the proxy's failure.

Pinning: the proxy on the server CPUs (0); the replayers on the client CPUs (1); the back end
on --backend-cpus, by default the client CPUs too (the machine has 2 cores: the back end
shares the client's, which is acceptable because it serves small files and is the same for
every proxy; its peak CPU is recorded so a saturated back end shows).

The variants (s4_failover.py, s4_mirror.py) reuse this class's set-up, replay and counting.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from arena import adtraffic, ports, proxycount, tcptune
from arena.clients import httperf
from arena.clients.base import LoadResult
from arena.measure import Sampler, TreeSample
from arena.scenarios import register
from arena.scenarios.base import CLIENT_BOUND_PCT, Context, Options, Point, Scenario, record
from arena.servers import SERVERS
from arena.servers.base import RunningServer, Site, SiteOptions

SEED = 4
# The log's length: its largest header set (55 %) stays within what httperf reads from one
# session file; longer runs cycle through it.
LOG_REQUESTS = 1_800
TIMEOUT_S = 5


@dataclass(frozen=True)
class ReplayGroup:
    """One part of the log replayed by its own httperf: its requests, the headers sent with
    each, and its share of the point's rate."""
    name: str
    requests: tuple[adtraffic.Request, ...]
    headers: tuple[str, ...]
    share: float


@dataclass
class ReplayRun:
    """What one point's replay produced, before the back ends' logs are read."""
    done: list[httperf.ReplayResult]
    proxy: TreeSample
    backend_peak_cpu_pct: float     # the busiest back end's peak
    tcp_states: dict[str, int]


def header_groups(log: list[adtraffic.Request]) -> list[ReplayGroup]:
    """One replayer per header set, each at the share of the log it has."""
    return [ReplayGroup(name, tuple(requests), adtraffic.HEADER_SETS[name][1], adtraffic.HEADER_SETS[name][0])
            for name, requests in adtraffic.split(log).items()]


@register
class S4Proxy(Scenario):
    name = "s4-proxy"
    title = "S4 reverse proxies: a replayed ad-delivery log at increasing rates, counting lost requests"
    study = "S4 - Apache 2.4 vs Nginx as reverse proxies under real traffic (2012)"
    description = ("Each server proxies everything to one back end (Debian's nginx, ad JSON files of 200-2,000 B, "
                   "access log on) over kept upstream connections where it can. A generated ad-delivery log "
                   "(5 % POSTs, three header sets, one request per connection) is replayed open-loop by httperf "
                   "--wsesslog, one per header set, at 250 to 10,000 requests/s, 10 s each. Lost = planned minus "
                   "served by the back end (its access log). Proxy on CPU 0, httperf on CPU 1, the back end on "
                   "--backend-cpus (default: the client CPUs, shared with httperf on a 2-core machine).")
    tools = ["httperf", "ss"]
    x_label = "offered requests per second"
    study_columns = [("Rate (req/s)", "rate"), ("Planned", "planned"), ("Sent", "sent"), ("Answered 2xx", "ok"),
                     ("Served by back end", "backend_served"), ("Lost", "lost"), ("Loss %", "loss_pct"),
                     ("Median (ms)", "p50_ms"), ("Mean (ms)", "mean_ms"), ("Max CPU %", "peak_cpu_pct"),
                     ("CPU s / 10k", "cpu_per_10k"), ("Memory (PSS MiB)", "peak_pss_mib"),
                     ("SYN-RECV (peak)", "tcp_syn_recv"), ("TIME-WAIT (peak)", "tcp_time_wait"),
                     ("Note", "note")]
    kind = "proxy"

    def __init__(self) -> None:
        super().__init__()
        self.workdir: Path | None = None
        self.backend: RunningServer | None = None
        # Every back end this scenario started (the variants start more than one).
        self.backends: list[RunningServer] = []
        self.groups: dict[str, tuple[ReplayGroup, Path]] = {}
        self.tuning: tcptune.Tuning | None = None
        self.client_ports: tuple[int, int] = tcptune.WIDE_RANGE
        self.reuse = True

    # -- what the variants change -----------------------------------------------------------
    def site_options(self, options: Options) -> SiteOptions:
        port = self.backend.site.port if self.backend else 0
        return SiteOptions(kind=self.kind, connections=4096,
                           app={"backend_host": ports.HOST, "backend_port": port})

    def replay_groups(self, log: list[adtraffic.Request]) -> list[ReplayGroup]:
        return header_groups(log)

    def start_backends(self, options: Options, files: dict[str, int]) -> dict:
        """Start the back end(s); return what to record about them."""
        self.backend = self.start_backend("backend", self.workdir / "www", options)
        return {"backend": self.backend_info(self.backend, options, files)}

    def _rates(self, options: Options) -> list[int]:
        # Dense where proxies start losing: on the 2-core machine the replayers and the back end
        # saturate CPU 1 near 10,000/s, so the rates above 5,000 tell the proxies apart.
        return [50, 100] if options.quick else [250, 1000, 2000, 4000, 5000, 6000, 7000, 8000, 9000, 10000]

    # -- set-up shared by the variants ------------------------------------------------------
    def backend_cpus(self, options: Options) -> str:
        return options.backend_cpus or options.client_cpus

    def start_backend(self, name: str, docroot: Path, options: Options) -> RunningServer:
        """Debian's nginx serving the ad files with its access log on, on a port outside the
        client port range (so it can be restarted on the same port whatever connections are
        open), pinned to the back-end CPUs."""
        site = Site(docroot, ports.free_port_outside(self.client_ports),
                    SiteOptions(kind="adserver", access_log=True, connections=8192))
        server = SERVERS["nginx"].start(site, self.workdir / name, "tuned", self.backend_cpus(options))
        self.backends.append(server)
        return server

    def backend_info(self, server: RunningServer, options: Options, files: dict[str, int]) -> dict:
        return {"server": SERVERS["nginx"].version(), "address": f"{server.site.host}:{server.site.port}",
                "cpus": self.backend_cpus(options), "files": files}

    def prepare(self, options: Options, servers: list[str]) -> dict:
        self.tuning = tcptune.tune()
        self.client_ports = tcptune.port_range()
        self.reuse = tcptune.reuse_enabled(tcptune.read(tcptune.TW_REUSE))
        self.workdir = Path(tempfile.mkdtemp(prefix=f"arena-{self.name}-"))
        self.workdir.chmod(0o755)
        files = adtraffic.write_docroot(self.workdir / "www")
        log = adtraffic.generate(LOG_REQUESTS, SEED)
        for group in self.replay_groups(log):
            path = self.workdir / f"sessions-{group.name}.txt"
            path.write_text(adtraffic.session_file(list(group.requests[:httperf.MAX_SESSIONS])))
            self.groups[group.name] = (group, path)
        info = self.start_backends(options, files)
        info["log"] = {"seed": SEED, "requests": len(log), "posts": sum(r.method == "POST" for r in log),
                       "distinct_uris": len({r.uri for r in log}),
                       "header_sets": {n: len(rs) for n, rs in adtraffic.split(log).items()},
                       "replayers": {g.name: {"requests": len(g.requests), "share": g.share}
                                     for g, _ in self.groups.values()}}
        info["client_ports"] = {**self.tuning.to_dict(), "range": list(self.client_ports),
                                "tw_reuse_effective": self.reuse}
        return info

    def finish(self) -> None:
        for server in self.backends:
            server.stop()
        self.backends = []
        self.backend = None
        if self.tuning:
            self.tuning.restore()
            self.tuning = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self.groups = {}

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

    # -- one point ---------------------------------------------------------------------------
    def replays(self, rate: float, seconds: float, names: list[str] | None = None) -> list[httperf.Replay]:
        """One replayer per group (or the named ones), at its share of the rate."""
        out = []
        for name, (group, path) in self.groups.items():
            if names is not None and name not in names:
                continue
            part = rate * group.share
            out.append(httperf.Replay(name, str(path), max(1, round(part * seconds)), part, group.headers))
        return out

    def check_ports(self, server: RunningServer, rate: float, seconds: float) -> tcptune.PortCheck:
        """Wait until the point's connections fit in the client port range: the clients'
        towards the proxy, and the proxy's towards each back end (a proxy that keeps no
        upstream connections opens one per request)."""
        dests = {server.site.port: f"{server.name} at {server.site.host}"}
        dests.update({b.site.port: f"the back end at {b.site.host}" for b in self.backends})
        return tcptune.wait_for_ports(dests, tcptune.ports_needed(rate, seconds, self.reuse), self.client_ports,
                                      self.reuse)

    def replay(self, server: RunningServer, replays: list[httperf.Replay], ctx: Context, during=None) -> ReplayRun:
        """Run the replayers against the proxy while sampling it, the back ends and the TCP
        states. `during()` is called just before the replayers start (the failover variant
        starts its kill timer there)."""
        proxy = Sampler(server.pid).start()
        backends = [Sampler(b.pid).start() for b in self.backends]
        tcp = proxycount.TcpSampler({server.site.port, *(b.site.port for b in self.backends)}).start()
        try:
            if during is not None:
                during()
            done = httperf.run_sessions(server.site.host, server.site.port, replays, ctx.options.client_cpus,
                                        TIMEOUT_S)
        finally:
            proxy_sample = proxy.stop()
            backend_peak = max((b.stop().peak_cpu_percent for b in backends), default=0.0)
            states = tcp.stop()
        return ReplayRun(done, proxy_sample, backend_peak, states)

    def client_record(self, point: Point, run: ReplayRun) -> dict:
        """The record as the clients saw the point. A replayer that stalled or failed makes
        the point the tool's failure: its counts are kept, but nothing is counted as failed
        or lost against the server."""
        done = run.done
        result = proxycount.combine([d.result for d in done])
        stalled = [d.replay.name for d in done if d.stalled]
        failures = [f"{d.replay.name}: {d.failure}" for d in done if d.failure]
        rec = record(result, None, "; ".join(failures) or None, run.proxy)
        planned = sum(d.replay.sessions for d in done)
        ok = int(result.extra["status_2xx"])
        cpu = sum(d.tool.cpu_seconds for d in done)
        wall = max(d.tool.wall_seconds for d in done)
        tool_failed = bool(failures)
        rec.update({
            "rate": point.params["rate"], "planned": planned, "ok": ok,
            # Every planned request not answered 2xx, as the client sees it.
            "failures": None if tool_failed else planned - ok,
            "tool_stalled": bool(stalled), "stalled_replayers": stalled, "tool_failed": tool_failed,
            "backend_peak_cpu_pct": run.backend_peak_cpu_pct,
            "tcp_states": run.tcp_states,
            "tcp_syn_recv": run.tcp_states.get("SYN-RECV", 0),
            "tcp_time_wait": run.tcp_states.get("TIME-WAIT", 0),
            "client_cpu_pct": 100.0 * cpu / wall if wall else None,
        })
        rec["client_bound"] = rec["client_cpu_pct"] is not None and rec["client_cpu_pct"] >= CLIENT_BOUND_PCT
        return rec

    def not_measured(self, point: Point, planned: int, why: str) -> dict:
        """A point that could not run (no client ports): an error, no figures, no failures."""
        rec = record(LoadResult(tool="httperf"), None, why, TreeSample())
        rec.update({"rate": point.params["rate"], "planned": planned, "failures": None, "not_measured": True,
                    "tool_stalled": False, "tool_failed": False, "client_bound": False})
        return rec

    def add_loss(self, rec: dict, served: int) -> None:
        """Requests lost between client and back end(s); not counted for a tool failure (the
        replay did not send what was planned)."""
        rec["backend_served"] = served
        if rec["tool_failed"]:
            rec["lost"] = rec["loss_pct"] = None
        else:
            rec["lost"], rec["loss_pct"] = proxycount.loss(rec["planned"], served)

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        rate, seconds = point.params["rate"], point.params["seconds"]
        replays = self.replays(rate, seconds)
        check = self.check_ports(server, rate, seconds)
        if not check.ok:
            return self.not_measured(point, sum(r.sessions for r in replays), check.message)
        access = self.backend.rundir / "access.log"
        offset = proxycount.log_size(access)
        run = self.replay(server, replays, ctx)
        rec = self.client_record(point, run)
        # Requests the proxy still holds reach the back end's log shortly after the replay.
        statuses = proxycount.settle(lambda: proxycount.served_since(access, offset), rec["sent"] or 0)
        self.add_loss(rec, sum(statuses.values()))
        rec["backend_statuses"] = dict(sorted(statuses.items()))
        rec["port_wait_s"] = round(check.waited_s, 2)
        return rec


def merge_statuses(counts: list[Counter]) -> dict[str, int]:
    total: Counter = Counter()
    for c in counts:
        total.update(c)
    return dict(sorted(total.items()))
