"""Small static: robots.txt (204 bytes) with wrk at concurrency 100 and 1,000, keep-alive and a
new connection per request - the rows of the performance issue's capacity table (issue 30),
where a server's own cost per request shows most: the answer is one small write, so what is
left is the event loop, parsing, the lookup and the kernel's socket work. Run it with
`--server-quota` and the `floor` reference server (a bare epoll loop) to read each server as
capacity per core and against the floor."""

from __future__ import annotations

from arena.scenarios import register
from arena.scenarios.base import Options, Point
from arena.scenarios.s1_static import S1Static

PATH = "/robots.txt"


@register
class SmallStatic(S1Static):
    name = "small-static"
    title = "Small static: robots.txt, concurrency 100 and 1,000"
    study = "issue 30 (capacity per core against the floor)"
    description = ("robots.txt (204 bytes); 100,000 requests per point at concurrency 100 and "
                   "1,000; keep-alive and new connection per request; wrk.")
    tools = ["wrk"]
    transports = ("http",)

    def points(self, options: Options) -> list[Point]:
        levels = [10, 100] if options.quick else [100, 1000]
        requests = options.requests or (1000 if options.quick else 100_000)
        points = []
        for close in (False, True):
            connection = "new connection" if close else "keep-alive"
            for c in levels:
                points.append(Point(
                    key=f"wrk/{'close' if close else 'keepalive'}/c{c}",
                    series=f"wrk {connection}", x=c,
                    params={"client": "wrk", "connection": connection, "close": close,
                            "concurrency": c, "requests": max(requests, c), "path": PATH}))
        return points

    def probe_paths(self) -> list[str]:
        return [PATH]
