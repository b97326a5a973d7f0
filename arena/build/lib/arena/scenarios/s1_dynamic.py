"""S1 dynamic: the Shakespeare PHP app (apps/shakespeare) at concurrency 1, 10, 100 and 1,000,
a fixed number of requests per point over a fixed mix of the app's URLs (HTML and JSON),
keep-alive and a new connection per request, with wrk and h2load. Every server but Apache
prefork reaches the same PHP-FPM pool; prefork runs PHP with mod_php, as in the study.

An answer that is not 2xx, a socket error or a request never answered is a failed response.
"""

from __future__ import annotations

from arena.clients import h2load, wrk
from arena.scenarios import register
from arena.scenarios._php_app import PhpAppScenario, h2load_bodies, wrk_bytes_bounds
from arena.scenarios.base import Context, Options, Point, record
from arena.servers.base import RunningServer

CLIENTS = ("wrk", "h2load")


@register
class S1Dynamic(PhpAppScenario):
    name = "s1-dynamic"
    title = "S1 dynamic: the Shakespeare PHP app, concurrency 1 to 1,000"
    study = "S1 - Apache vs Nginx, static and dynamic content, concurrency 1 to 1,000 (2015)"
    description = ("The Shakespeare app (PHP-FPM + MariaDB; Apache prefork with mod_php): a fixed mix of its "
                   "URLs (the front page; per work the work, its first act, that act's first scene; HTML and "
                   "JSON) cycled in order; 100,000 requests per point at concurrency 1, 10, 100, 1,000; "
                   "keep-alive and new connection per request; wrk and h2load. Non-2xx answers count as failed.")
    tools = ["wrk", "h2load"]
    x_label = "concurrency"
    study_columns = [("Client", "client"), ("Connection", "connection"), ("Requests", "requests"),
                     ("Concurrency", "concurrency"), ("Req/s", "rps"), ("Max CPU %", "peak_cpu_pct"),
                     ("Memory (PSS MiB)", "peak_pss_mib"), ("PHP-FPM max CPU %", "php_peak_cpu_pct"),
                     ("PHP-FPM memory (PSS MiB)", "php_peak_pss_mib"),
                     ("CPU s / 10k (server + PHP)", "total_cpu_per_10k"), ("Failed responses", "failures")]

    def _levels(self, options: Options) -> list[int]:
        return [1, 10, 100] if options.quick else [1, 10, 100, 1000]

    def most_connections(self, options: Options) -> int:
        return max(self._levels(options))

    def points(self, options: Options) -> list[Point]:
        requests = options.requests or (300 if options.quick else 100_000)
        points = []
        for client in CLIENTS:
            for close in (False, True):
                connection = "new connection" if close else "keep-alive"
                for c in self._levels(options):
                    points.append(Point(
                        key=f"{client}/{'close' if close else 'keepalive'}/c{c}",
                        series=f"{client} {connection}", x=c,
                        params={"client": client, "connection": connection, "close": close,
                                "concurrency": c, "requests": max(requests, c)}))
        return points

    def warmup(self, point: Point, options: Options) -> Point:
        c = point.params["concurrency"]
        n = max(2 * c, 100 if options.quick else point.params["requests"] // 20)
        return Point(point.key + "/warmup", point.series, point.x, {**point.params, "requests": n})

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        p = point.params
        cpus = ctx.options.client_cpus
        if p["client"] == "wrk":
            paths = str(self.urls_file(server, absolute=False))

            def run():
                return wrk.run(server.url("/"), p["concurrency"], p["requests"], cpus, close=p["close"],
                               tick=ctx.tick, paths_file=paths)
        else:
            uris = str(self.urls_file(server, absolute=True))

            def run():
                return h2load.run(server.url("/"), p["concurrency"], p["requests"], cpus, close=p["close"],
                                  tick=ctx.tick, uris_file=uris)

        result, tool, failure, sample, php = self.sampled(server, run)
        rec = record(result, tool, failure, sample)
        served = result.sent if result.sent else result.requests
        self.add_php(rec, sample, php, served)
        sizes = [u.body_bytes for u in self.app.urls]
        rec["body_size"] = sum(sizes) / len(sizes)  # the mix's mean, for reference
        if p["client"] == "wrk":
            # Every request not answered 2xx: wrk_paths.lua counts non-2xx answers, wrk the
            # socket errors, and a run cut short by its time bound leaves some unanswered.
            unanswered = max(0, p["requests"] - result.requests)
            rec["failures"] = result.socket_errors + result.non_2xx_3xx + unanswered
            overhead = self.overhead_range(server)
            if rec["failures"] == 0 and overhead and result.sent and result.bytes_total is not None:
                low, high = wrk_bytes_bounds(sizes, result.sent, result.requests, overhead)
                rec["bytes_ok"] = low <= result.bytes_total <= high
                rec["bytes_expected"] = [low, high]
        else:
            # h2load's "failed" is every request without a 2xx or 3xx answer; 3xx fail here too.
            rec["failures"] = result.failures + int(result.extra.get("status_3xx") or 0)
            if rec["failures"] == 0 and result.body_bytes is not None:
                expected = h2load_bodies(sizes, p["requests"], p["concurrency"])
                rec["bytes_ok"] = result.body_bytes == expected
                rec["bytes_expected"] = expected
        return rec
