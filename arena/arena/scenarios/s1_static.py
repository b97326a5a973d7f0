"""S1 static: the 394 KB wallpaper at concurrency 1, 10, 100 and 1,000, a fixed number of
requests per point, keep-alive and a new connection per request, with wrk and h2load.

Variants (`--tls`, `--h2`, arena/tls.py):
- HTTPS/1.1: the same points over TLS, with both clients, so each series compares with its
  cleartext twin. New-connection points measure handshakes per second: full handshakes
  unless the run leaves resumption on (both wrk and h2load offer the previous connection's
  session). wrk offers no ALPN; h2load offers http/1.1 and reports what was negotiated.
- HTTP/2 over TLS: h2load with 1 and with 10 streams per connection, keep-alive only: an
  HTTP/2 client keeps its connection, and h2load has no way to open a new one per request
  (the handshake rate is the HTTPS/1.1 variant's new-connection points)."""

from __future__ import annotations

from arena.clients import h2load, wrk
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point, Scenario, record, sampled
from arena.servers.base import RunningServer, SiteOptions
from arena.workload import IMAGE_NAME

CLIENTS = {"wrk": wrk, "h2load": h2load}
PATH = f"/{IMAGE_NAME}"
# Streams per connection of the HTTP/2 points: one (the HTTP/1.1 points' load, framed as h2)
# and ten (multiplexing, as a browser fetching a page's images does).
H2_STREAMS = (1, 10)


@register
class S1Static(Scenario):
    name = "s1-static"
    title = "S1 static: the 394 KB image, concurrency 1 to 1,000"
    study = "S1 - Apache vs Nginx, static and dynamic content, concurrency 1 to 1,000 (2015)"
    description = ("1920x1200 JPEG of 394 KiB; 100,000 requests per point at concurrency 1, 10, "
                   "100, 1,000; keep-alive and new connection per request; wrk and h2load.")
    tools = ["wrk", "h2load"]
    transports = ("http", "tls", "h2")
    x_label = "concurrency"
    study_columns = [("Client", "client"), ("Connection", "connection"), ("Requests", "requests"),
                     ("Concurrency", "concurrency"), ("Req/s", "rps"), ("Max CPU %", "peak_cpu_pct"),
                     ("Memory (PSS MiB)", "peak_pss_mib"), ("Failed responses", "failures")]

    def site_options(self, options: Options) -> SiteOptions:
        return SiteOptions(connections=1000 if not options.quick else 128)

    def points(self, options: Options) -> list[Point]:
        levels = [1, 10, 100] if options.quick else [1, 10, 100, 1000]
        requests = options.requests or (1000 if options.quick else 100_000)
        if options.transport == "h2":
            return self._h2_points(levels, requests)
        tls = options.transport == "tls"
        points = []
        for client in CLIENTS:
            for close in (False, True):
                connection = "new connection" if close else "keep-alive"
                for c in levels:
                    key = f"{client}/{'close' if close else 'keepalive'}/c{c}"
                    points.append(Point(
                        key=f"tls/{key}" if tls else key,
                        series=f"{client} {'https ' if tls else ''}{connection}", x=c,
                        params={"client": client, "connection": connection, "close": close,
                                "concurrency": c, "requests": max(requests, c), "path": PATH,
                                **({"protocol": "https/1.1"} if tls else {})}))
        return points

    @staticmethod
    def _h2_points(levels: list[int], requests: int) -> list[Point]:
        points = []
        for streams in H2_STREAMS:
            for c in levels:
                points.append(Point(
                    key=f"h2/h2load/m{streams}/c{c}",
                    series=f"h2load h2, {streams} stream{'s' if streams > 1 else ''} per connection", x=c,
                    params={"client": "h2load", "connection": f"keep-alive, {streams} streams",
                            "close": False, "concurrency": c, "streams": streams, "protocol": "h2",
                            # Enough for every stream of every connection to be used.
                            "requests": max(requests, c * streams), "path": PATH}))
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
        h2 = {"http2": True, "streams": p["streams"]} if p.get("protocol") == "h2" else {}
        result, tool, failure, sample = sampled(server, lambda: client.run(
            server.url(p["path"]), p["concurrency"], p["requests"], ctx.options.client_cpus,
            close=p["close"], tick=ctx.tick, **h2))
        probe = server.probes.get(p["path"], {})
        header_range = (probe["header_min"], probe["header_max"]) if probe else None
        return record(result, tool, failure, sample, body_size=ctx.files[p["path"].lstrip("/")],
                      header_range=header_range)
