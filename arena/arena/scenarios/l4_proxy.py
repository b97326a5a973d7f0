"""The l4-proxy scenario (issue 34): gannet's and nginx's `stream {}` and HAProxy's `mode tcp`
relaying TCP connections to one back end, bytes as they are.

The back end is Debian's nginx on the back-end CPUs serving files; the load is HTTP through the
proxy (wrk), which a layer-4 proxy never parses, so what is measured is the relay:
- short sessions: a new connection per request, about 1 KB each way (a request padded with a
  header to 1 KB, a 1 KB file back), then closed - sessions per second and server CPU per
  session (10k sessions);
- bulk: 1 GiB relayed over kept connections (16 answers of 64 MiB) - throughput and server CPU
  per GB.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from arena import ports
from arena.clients import wrk
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point, Scenario, record, sampled
from arena.servers import SERVERS
from arena.servers.base import RunningServer, Site, SiteOptions
from arena.workload import make_docroot

SESSION_FILE = "1k.bin"
SESSION_BYTES = 1024
BULK_FILE = "bulk.bin"
BULK_BYTES = 64 << 20
BULK_ANSWERS = 16
# wrk's request line and headers come to about 100 bytes; the padding makes it 1 KB.
PADDING = "X-Pad: " + "p" * 950


def session_request_bytes(host: str, port: int) -> int:
    """The size of the short sessions' request as wrk sends it (for the report)."""
    return len(f"GET /{SESSION_FILE} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n{PADDING}\r\n\r\n")


@register
class L4Proxy(Scenario):
    name = "l4-proxy"
    title = "Layer-4 proxies: short TCP sessions and bulk relay through gannet, nginx and HAProxy"
    study = "issue 34 - a TCP/UDP stream proxy against nginx's stream module and HAProxy"
    description = ("Each server relays TCP connections to one back end (Debian's nginx serving files, on the "
                   "back-end CPUs). Short sessions: wrk, a new connection per request, 1 KB each way, "
                   "concurrency 10 and 100. Bulk: 1 GiB relayed (16 answers of 64 MiB) over 1 and 4 kept "
                   "connections. Server CPU per 10k sessions and per GB.")
    tools = ["wrk"]
    x_label = "concurrency"
    study_columns = [("Load", "load"), ("Concurrency", "concurrency"), ("Sessions or answers/s", "rps"),
                     ("GB/s", "gb_per_s"), ("CPU s / 10k", "cpu_per_10k"), ("CPU s / GB", "cpu_per_gb"),
                     ("Memory (PSS MiB)", "peak_pss_mib"), ("Failed", "failures")]

    def __init__(self) -> None:
        super().__init__()
        self.workdir: Path | None = None
        self.backend: RunningServer | None = None
        self.files: dict[str, int] = {}

    def site_options(self, options: Options) -> SiteOptions:
        port = self.backend.site.port if self.backend else 0
        return SiteOptions(kind="l4-proxy", connections=256,
                           app={"backend_host": ports.HOST, "backend_port": port})

    def prepare(self, options: Options, servers: list[str]) -> dict:
        backend_cpus = options.backend_cpus or options.client_cpus
        self.workdir = Path(tempfile.mkdtemp(prefix="arena-l4-"))
        self.workdir.chmod(0o755)
        www = self.workdir / "www"
        self.files = make_docroot(www)
        for name, size in ((SESSION_FILE, SESSION_BYTES), (BULK_FILE, BULK_BYTES)):
            (www / name).write_bytes(bytes(i % 251 for i in range(251)) * (size // 251) + b"x" * (size % 251))
            (www / name).chmod(0o644)
            self.files[name] = size
        site = Site(www, ports.free_port(), SiteOptions(connections=1024))
        self.backend = SERVERS["nginx"].start(site, self.workdir / "backend", "tuned", backend_cpus)
        return {"backend": {"server": SERVERS["nginx"].version(), "address": f"{site.host}:{site.port}",
                            "cpus": backend_cpus, "files": {SESSION_FILE: SESSION_BYTES, BULK_FILE: BULK_BYTES}},
                "session_request_bytes": session_request_bytes(site.host, site.port)}

    def finish(self) -> None:
        if self.backend:
            self.backend.stop()
            self.backend = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def points(self, options: Options) -> list[Point]:
        sessions = options.requests or (500 if options.quick else 100_000)
        bulk = 2 if options.quick else BULK_ANSWERS
        points = [Point(key=f"sessions/c{c}", series="short sessions (1 KB each way)", x=c,
                        params={"load": "short sessions", "concurrency": c, "requests": max(sessions, c),
                                "path": f"/{SESSION_FILE}", "close": True})
                  for c in ((10,) if options.quick else (10, 100))]
        points += [Point(key=f"bulk/c{c}", series="bulk (64 MiB answers, kept connections)", x=c,
                         params={"load": "bulk", "concurrency": c, "requests": max(bulk, c),
                                 "path": f"/{BULK_FILE}", "close": False})
                   for c in ((1,) if options.quick else (1, 4))]
        return points

    def warmup(self, point: Point, options: Options) -> Point | None:
        if point.params["load"] != "short sessions":
            return None
        n = max(2 * point.params["concurrency"], 100 if options.quick else point.params["requests"] // 20)
        return Point(point.key + "/warmup", point.series, point.x, {**point.params, "requests": n})

    def probe_paths(self) -> list[str]:
        return [f"/{SESSION_FILE}", f"/{BULK_FILE}"]

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        p = point.params
        headers = (PADDING,) if p["close"] else ()
        result, tool, failure, sample = sampled(server, lambda: wrk.run(
            server.url(p["path"]), p["concurrency"], p["requests"], ctx.options.client_cpus, close=p["close"],
            tick=ctx.tick, headers=headers))
        probe = server.probes.get(p["path"], {})
        header_range = (probe["header_min"], probe["header_max"]) if probe else None
        rec = record(result, tool, failure, sample, body_size=self.files[p["path"].lstrip("/")],
                     header_range=header_range)
        rec.update({"load": p["load"], "concurrency": p["concurrency"]})
        gigabytes = (result.bytes_total or 0) / 1e9
        if p["load"] == "bulk" and gigabytes and result.duration_s:
            rec.update({"gb_per_s": gigabytes / result.duration_s, "cpu_per_gb": sample.cpu_seconds / gigabytes})
        return rec
