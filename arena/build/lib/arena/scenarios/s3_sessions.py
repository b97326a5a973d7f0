"""S3 sessions: siege's concurrent-session sweep (5, 10, 20, 30, 35, 40, ... 60 sessions) over
the Shakespeare app's URL mix, reported in the study's own columns (transactions, elapsed time,
data transferred, response time, transaction rate, throughput, concurrency, failed), with the
CPU and memory of the server and of the PHP tier (the PHP-FPM pool) beside them. The study ran
the distributions' packaged configs: `--profile default` is its set-up.

siege runs with no siegerc (its built-in defaults: a new connection per transaction, no
think time with -b); each session goes through the URL list in order from its own starting
line. A transaction that is not answered 2xx is a failed one (siege's own count leaves 4xx out).
"""

from __future__ import annotations

import math

from arena.clients import siege
from arena.scenarios import register
from arena.scenarios._php_app import PhpAppScenario
from arena.scenarios.base import Context, Options, Point, record
from arena.servers.base import RunningServer

SESSIONS = [5, 10, 20, 30, 35, 40, 45, 50, 55, 60]
QUICK_SESSIONS = [5, 10]


@register
class S3Sessions(PhpAppScenario):
    name = "s3-sessions"
    title = "S3 sessions: siege, 5 to 60 concurrent sessions on the Shakespeare PHP app"
    study = "S3 - Nginx vs Lighttpd with PHP-FPM and MySQL (2012)"
    description = ("siege -b, concurrent sessions 5, 10, 20, 30, 35, 40, 45, 50, 55, 60, 20,000 transactions "
                   "per step over the Shakespeare app's URL mix (siege -f, a new connection per transaction); "
                   "server and PHP-FPM CPU and memory. The study used packaged configs: --profile default.")
    tools = ["siege"]
    x_label = "concurrent sessions"
    study_columns = [("Sessions", "sessions"), ("Transactions", "transactions"), ("Elapsed (s)", "elapsed_s"),
                     ("Data (MB)", "data_mb"), ("Response time (s)", "response_s"),
                     ("Transaction rate (/s)", "rps"), ("Throughput (MB/s)", "throughput_mb_s"),
                     ("Concurrency", "siege_concurrency"), ("Failed", "failures"),
                     ("Server max CPU %", "peak_cpu_pct"), ("Server PSS (MiB)", "peak_pss_mib"),
                     ("PHP-FPM max CPU %", "php_peak_cpu_pct"), ("PHP-FPM PSS (MiB)", "php_peak_pss_mib"),
                     ("CPU s / 10k (server + PHP)", "total_cpu_per_10k")]

    def _levels(self, options: Options) -> list[int]:
        return QUICK_SESSIONS if options.quick else SESSIONS

    def most_connections(self, options: Options) -> int:
        return max(self._levels(options))

    def points(self, options: Options) -> list[Point]:
        total = options.requests or (200 if options.quick else 20_000)
        points = []
        for users in self._levels(options):
            reps = max(1, math.ceil(total / users))
            points.append(Point(key=f"sessions{users}", series="siege sessions", x=users,
                                params={"sessions": users, "reps": reps, "planned_transactions": users * reps}))
        return points

    def warmup(self, point: Point, options: Options) -> Point:
        users = point.params["sessions"]
        reps = 5 if options.quick else max(5, point.params["reps"] // 20)
        return Point(point.key + "/warmup", point.series, point.x,
                     {**point.params, "reps": reps, "planned_transactions": users * reps})

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        p = point.params
        urls = str(self.urls_file(server, absolute=True))
        result, tool, failure, sample, php = self.sampled(server, lambda: siege.run(
            None, p["sessions"], p["reps"], ctx.options.client_cpus, tick=ctx.tick, urls_file=urls, verbose=True))
        rec = record(result, tool, failure, sample)
        served = result.sent if result.sent else result.requests
        self.add_php(rec, sample, php, served)
        x = result.extra
        rec.update({
            "transactions": x.get("transactions"), "elapsed_s": x.get("elapsed_s"), "data_mb": x.get("data_mb"),
            "response_s": x.get("response_s"), "throughput_mb_s": x.get("throughput_mb_s"),
            "siege_concurrency": x.get("concurrency"), "siege_failed": x.get("failed"),
        })
        lines = siege.transactions(tool.stdout) if tool else []
        non_2xx = sum(1 for status, _, _, _ in lines if not 200 <= status < 300)
        # Transactions siege never made (it gives up on a user after too many socket errors).
        missing = max(0, p["planned_transactions"] - len(lines)) if lines or not failure else 0
        rec["non_2xx_3xx"] = non_2xx
        rec["failures"] = result.socket_errors + non_2xx + missing
        size = self.app.size_of()
        sized = [(path, got) for status, _, got, path in lines if 200 <= status < 300]
        if sized and rec["failures"] == 0:
            rec["bytes_ok"] = all(size.get(path) == got for path, got in sized)
            rec["bytes_expected"] = sum(size.get(path, 0) for path, _ in sized)
        rec["body_size"] = sum(size.values()) / len(size)
        return rec
