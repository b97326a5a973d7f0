"""S5 latency: ab's response time (mean, 99th percentile, max) against the number of requests
at several concurrency levels, on a small static page; then the same "under stress", with 4
busy loops competing for the server's CPU."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager

from arena import procs
from arena.clients import ab
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point, Scenario, record, sampled
from arena.servers.base import RunningServer

PATH = "/index.html"
BUSY_LOOPS = 4


@contextmanager
def busy_loops(count: int, cpus: str, seconds: float):
    """`count` shell busy loops pinned to `cpus`; each also ends by itself after `seconds`."""
    loops = [subprocess.Popen(procs.pinned(["timeout", f"{seconds:.0f}", "sh", "-c", "while :; do :; done"], cpus),
                              stdin=subprocess.DEVNULL, start_new_session=True) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            try:
                os.killpg(loop.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            loop.wait()


@register
class S5Latency(Scenario):
    name = "s5-latency"
    title = "S5 latency: ab response times, then under stress (4 busy loops)"
    study = "S5 - Apache (worker) vs Nginx response times, static and dynamic (2013)"
    description = ("ab, a new connection per request, on a 2.7 KB static page: 1,000 and 10,000 requests "
                   "at concurrency 10, 100 and 500; repeated with 4 busy loops on the server CPU.")
    tools = ["ab"]
    x_label = "requests"
    study_columns = [("Variant", "variant"), ("Concurrency", "concurrency"), ("Requests", "requests"),
                     ("Mean (ms)", "mean_ms"), ("p99 (ms)", "p99_ms"), ("Max (ms)", "max_ms"),
                     ("Req/s", "rps"), ("Failed responses", "failures")]

    def points(self, options: Options) -> list[Point]:
        levels = [10] if options.quick else [10, 100, 500]
        counts = [options.requests] if options.requests else ([500] if options.quick else [1000, 10_000])
        points = []
        for variant in ("normal", "stress"):
            for c in levels:
                for n in counts:
                    points.append(Point(key=f"{variant}/c{c}/n{n}", series=f"{variant}, c={c}", x=n,
                                        params={"variant": variant, "concurrency": c,
                                                "requests": max(n, c), "path": PATH}))
        return points

    def warmup(self, point: Point, options: Options) -> Point | None:
        if point.params["variant"] != "normal":
            return None
        return Point(point.key + "/warmup", point.series, point.x,
                     {**point.params, "requests": max(point.params["concurrency"], 200)})

    def probe_paths(self) -> list[str]:
        return [PATH]

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        p = point.params

        def load():
            return ab.run(server.url(p["path"]), p["concurrency"], p["requests"], ctx.options.client_cpus,
                          tick=ctx.tick)

        if p["variant"] == "stress":
            with busy_loops(BUSY_LOOPS, ctx.options.server_cpus, seconds=max(60, p["requests"] / 50 + 60)):
                result, tool, failure, sample = sampled(server, load)
        else:
            result, tool, failure, sample = sampled(server, load)
        probed = server.probes.get(p["path"], {})
        return record(result, tool, failure, sample, body_size=ctx.files["index.html"],
                      header_range=(probed["header_min"], probed["header_max"]) if probed else None)
