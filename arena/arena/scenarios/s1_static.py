"""S1 static: the 394 KB wallpaper at concurrency 1, 10, 100 and 1,000, a fixed number of
requests per point, keep-alive and a new connection per request, with wrk and h2load."""

from __future__ import annotations

from arena.clients import h2load, wrk
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point, Scenario, record, sampled
from arena.servers.base import RunningServer, SiteOptions
from arena.workload import IMAGE_NAME

CLIENTS = {"wrk": wrk, "h2load": h2load}
PATH = f"/{IMAGE_NAME}"


@register
class S1Static(Scenario):
    name = "s1-static"
    title = "S1 static: the 394 KB image, concurrency 1 to 1,000"
    study = "S1 - Apache vs Nginx, static and dynamic content, concurrency 1 to 1,000 (2015)"
    description = ("1920x1200 JPEG of 394 KiB; 100,000 requests per point at concurrency 1, 10, "
                   "100, 1,000; keep-alive and new connection per request; wrk and h2load.")
    tools = ["wrk", "h2load"]
    x_label = "concurrency"
    study_columns = [("Client", "client"), ("Connection", "connection"), ("Requests", "requests"),
                     ("Concurrency", "concurrency"), ("Req/s", "rps"), ("Max CPU %", "peak_cpu_pct"),
                     ("Memory (PSS MiB)", "peak_pss_mib"), ("Failed responses", "failures")]

    def site_options(self, options: Options) -> SiteOptions:
        return SiteOptions(connections=1000 if not options.quick else 128)

    def points(self, options: Options) -> list[Point]:
        levels = [1, 10, 100] if options.quick else [1, 10, 100, 1000]
        requests = options.requests or (1000 if options.quick else 100_000)
        points = []
        for client in CLIENTS:
            for close in (False, True):
                connection = "new connection" if close else "keep-alive"
                for c in levels:
                    points.append(Point(
                        key=f"{client}/{'close' if close else 'keepalive'}/c{c}",
                        series=f"{client} {connection}", x=c,
                        params={"client": client, "connection": connection, "close": close,
                                "concurrency": c, "requests": max(requests, c), "path": PATH}))
        return points

    def warmup(self, point: Point, options: Options) -> Point:
        c = point.params["concurrency"]
        n = max(2 * c, 200 if options.quick else point.params["requests"] // 20)
        return Point(point.key + "/warmup", point.series, point.x, {**point.params, "requests": n})

    def probe_paths(self) -> list[str]:
        return [PATH]

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        p = point.params
        client = CLIENTS[p["client"]]
        result, tool, failure, sample = sampled(server, lambda: client.run(
            server.url(p["path"]), p["concurrency"], p["requests"], ctx.options.client_cpus,
            close=p["close"], tick=ctx.tick))
        probe = server.probes.get(p["path"], {})
        header_range = (probe["header_min"], probe["header_max"]) if probe else None
        return record(result, tool, failure, sample, body_size=ctx.files[IMAGE_NAME],
                      header_range=header_range)
