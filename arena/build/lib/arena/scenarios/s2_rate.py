"""S2 rate sweep: httperf opens new connections at 10, 20, ... 200 per second, each making 10
requests for robots.txt (keep-alive timeout 15 s, gzip on, Accept-Encoding: gzip); reply rate,
response time and bytes per reply (the study saw Apache send bigger headers)."""

from __future__ import annotations

from arena.clients import httperf
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point, Scenario, record, sampled
from arena.servers.base import RunningServer, SiteOptions

PATH = "/robots.txt"
CALLS = 10


@register
class S2Rate(Scenario):
    name = "s2-rate"
    title = "S2 rate sweep: robots.txt, 10 requests per connection, 10 to 200 connections/s"
    study = "S2 - Apache vs Nginx \"deathmatch\" (2008)"
    description = ("httperf --rate 10..200 step 10, --num-calls 10, timeout 5 s, 5 s per rate; "
                   "robots.txt with gzip on and keep-alive timeout 15 s.")
    tools = ["httperf"]
    x_label = "new connections per second"
    study_columns = [("Rate (conn/s)", "rate"), ("Connections", "connections"),
                     ("Reply rate (avg)", "rps"), ("Reply rate (max)", "reply_rate_max"),
                     ("Response time (ms)", "mean_ms"), ("Bytes / reply", "bytes_per_reply"),
                     ("Header bytes", "header_bytes"), ("Max CPU %", "peak_cpu_pct"),
                     ("Failed responses", "failures")]

    def site_options(self, options: Options) -> SiteOptions:
        return SiteOptions(gzip=True, keepalive_timeout=15, connections=1024)

    def points(self, options: Options) -> list[Point]:
        rates = [50, 200] if options.quick else list(range(10, 201, 10))
        seconds = 1 if options.quick else 5
        points = []
        for rate in rates:
            conns = max(1, options.requests // CALLS) if options.requests else rate * seconds
            points.append(Point(key=f"rate{rate}", series="httperf rate sweep", x=rate,
                                params={"rate": rate, "connections": conns, "calls": CALLS, "path": PATH}))
        return points

    def warmup(self, point: Point, options: Options) -> Point:
        return Point(point.key + "/warmup", point.series, point.x,
                     {**point.params, "connections": max(5, point.params["rate"] // 2)})

    def probe_paths(self) -> list[str]:
        return [PATH]

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        p = point.params
        result, tool, failure, sample = sampled(server, lambda: httperf.run(
            server.site.host, server.site.port, p["path"], p["rate"], p["connections"],
            ctx.options.client_cpus, num_calls=p["calls"], headers=["Accept-Encoding: gzip"],
            tick=ctx.tick))
        rec = record(result, tool, failure, sample)
        # httperf samples the reply rate every 5 s; shorter runs have no samples.
        if result.extra.get("reply_rate_samples"):
            rec["reply_rate_max"] = result.extra.get("reply_rate_max")
        return rec
