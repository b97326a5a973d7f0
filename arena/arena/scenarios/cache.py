"""The cache scenario (issue 33): each server is a cache in front of one origin, as the
micro-caching and API-edge configs people run: gannet (`proxy_cache`), nginx (`proxy_cache`)
and Varnish (the cache people put in front of nginx instead).

The origin is Debian's nginx on the back-end CPUs with its access log on: the Shakespeare PHP
app's pages by its PHP-FPM pool (pinned beside it) and a JSON API as files (study S4's ad
responses, 200 to 2,000 bytes, under many query strings). Every request the origin logs is one
the cache did not answer itself, so the point's measured hit ratio is 1 - origin / requests.

Points: the PHP pages and the JSON API, each at a 100 % and a 95 % hit ratio (every 20th
request a URL never asked before: a unique query string), keep-alive, concurrency 100 and
1,000, wrk over the URL list in order. Before its rounds every server is warmed with each URL
once, so a 100 % point's misses are zero. Entries stay valid for 10 minutes in every cache,
whatever the origin's headers say (PHP's session cookie and Cache-Control are ignored, as a
micro-cache config does).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

from arena import adtraffic, ports, proxycount, shakespeare
from arena.clients import wrk
from arena.measure import Sampler
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point, Scenario, record
from arena.servers import SERVERS
from arena.servers.base import RunningServer, Site, SiteOptions

# Every MISS_EVERY-th request of a 95 % point is a URL no cache has seen.
MISS_EVERY = 20
API_SITES = ("news", "sports", "video", "mail", "games", "finance")
API_SIZES = ("300x250", "728x90", "160x600", "320x50", "970x250")


def api_urls() -> list[str]:
    """The API's distinct URLs: every ad slot under every site and size (360)."""
    return [f"/ads/slot-{slot:02d}.json?site={site}&size={size}"
            for slot in range(1, adtraffic.SLOTS + 1) for site in API_SITES for size in API_SIZES]


def with_misses(urls: list[str], count: int, nonce: str) -> list[str]:
    """`count` request paths cycling through `urls`, every MISS_EVERY-th one made unique by a
    query argument naming `nonce` (a URL no earlier point, round or server asked for)."""
    out = []
    cycle = itertools.cycle(urls)
    for i in range(count):
        url = next(cycle)
        if (i + 1) % MISS_EVERY == 0:
            url += ("&" if "?" in url else "?") + f"arena_miss={nonce}-{i}"
        out.append(url)
    return out


@register
class Cache(Scenario):
    name = "cache"
    title = "Cache: PHP pages and a JSON API behind gannet, nginx and Varnish"
    study = "issue 33 - a response cache against nginx's proxy_cache and Varnish"
    description = ("Each server caches an origin (Debian's nginx with the Shakespeare PHP app by PHP-FPM and a "
                   "JSON API as files, on the back-end CPUs, access log on). wrk keep-alive at concurrency 100 "
                   "and 1,000 over the PHP pages or the API URLs, at a 100 % and a 95 % hit ratio (every 20th "
                   "request a URL never seen); every server warmed with each URL once. The origin's log gives "
                   "the measured hit ratio. Entries valid 10 minutes in every cache. At the 95 % points the "
                   "origin gets 5 % of each server's request rate, and the PHP pool shares the client's CPUs: "
                   "there p99 follows the rate a server reaches (the pool's queue), so it compares the caches "
                   "only at equal rates.")
    tools = ["wrk"]
    x_label = "concurrency"
    study_columns = [("Content", "content"), ("Hit target %", "hit_target"), ("Concurrency", "concurrency"),
                     ("Req/s", "rps"), ("CPU s / 10k", "cpu_per_10k"), ("p99 (ms)", "p99_ms"),
                     ("Hit %", "hit_pct"), ("Origin requests", "origin_requests"),
                     ("Memory (PSS MiB)", "peak_pss_mib"), ("Failed responses", "failures")]

    def __init__(self) -> None:
        super().__init__()
        self.workdir: Path | None = None
        self.origin: RunningServer | None = None
        self.app: shakespeare.App | None = None
        self.urls: dict[str, list[str]] = {}
        self.runs = itertools.count(1)

    def _levels(self, options: Options) -> list[int]:
        return [10] if options.quick else [100, 1000]

    def site_options(self, options: Options) -> SiteOptions:
        port = self.origin.site.port if self.origin else 0
        return SiteOptions(kind="cache", connections=max(self._levels(options)) * 2 + 64,
                           app={"backend_host": ports.HOST, "backend_port": port})

    def prepare(self, options: Options, servers: list[str]) -> dict:
        from arena.runner import cpu_list  # here: the runner imports this package
        backend_cpus = options.backend_cpus or options.client_cpus
        # The PHP tier beside the origin, on the back-end CPUs: what a miss costs there is
        # the same for every cache, and none of it lands on the server CPU.
        self.app = shakespeare.prepare([], "php", cpu_list(backend_cpus))
        self.workdir = Path(tempfile.mkdtemp(prefix="arena-cache-"))
        self.workdir.chmod(0o755)
        files = adtraffic.write_docroot(self.workdir / "www")
        site = Site(self.workdir / "www", ports.free_port(),
                    SiteOptions(kind="cache-origin", access_log=True, connections=4096,
                                app={"fastcgi_socket": shakespeare.SOCKET, "app_root": shakespeare.DOCROOT}))
        self.origin = SERVERS["nginx"].start(site, self.workdir / "origin", "tuned", backend_cpus)
        self.urls = {"php": [u.path for u in self.app.urls], "api": api_urls()}
        return {"origin": {"server": SERVERS["nginx"].version(), "address": f"{site.host}:{site.port}",
                           "cpus": backend_cpus, "files": files},
                "php": {k: self.app.record[k] for k in ("app", "php_fpm", "pool", "pool_children", "mariadb")},
                "urls": {k: len(v) for k, v in self.urls.items()}, "miss_every": MISS_EVERY}

    def finish(self) -> None:
        if self.origin:
            self.origin.stop()
            self.origin = None
        shakespeare.finish(self.app)
        self.app = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def points(self, options: Options) -> list[Point]:
        requests = options.requests or (500 if options.quick else 100_000)
        points = []
        for content in ("php", "api"):
            for hit in (100, 95):
                for c in self._levels(options):
                    points.append(Point(
                        key=f"{content}/hit{hit}/c{c}", series=f"{content} {hit}% hits", x=c,
                        params={"content": content, "hit_target": hit, "concurrency": c,
                                "requests": max(requests, c)}))
        return points

    def warmup(self, point: Point, options: Options) -> Point | None:
        # Each URL once, into every cache, before the first point's rounds.
        if point.key != self.selected(options)[0].key:
            return None
        return Point("warmup", point.series, point.x, {"warmup": True, "concurrency": 10})

    def probe_paths(self) -> list[str]:
        return ["/", "/ads/slot-01.json?site=news&size=300x250"]

    def _paths_file(self, server: RunningServer, lines: list[str]) -> str:
        path = server.rundir / "arena-paths.txt"
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        p = point.params
        if p.get("warmup"):
            lines = self.urls["php"] + self.urls["api"]
            requests = len(lines)
        else:
            requests = p["requests"]
            urls = self.urls[p["content"]]
            # Enough lines for every request wrk may send (it stops `concurrency` past the quota).
            count = requests + p["concurrency"] + 1
            if p["hit_target"] == 100:
                lines = urls
            else:
                lines = with_misses(urls, count, f"{server.name}{next(self.runs)}")
        paths = self._paths_file(server, lines)
        access = self.origin.rundir / "access.log"
        offset = proxycount.log_size(access)
        sampler = Sampler(server.pid).start()
        try:
            result, tool, failure = wrk.run(server.url("/"), p["concurrency"], requests, ctx.options.client_cpus,
                                            tick=ctx.tick, paths_file=paths)
        finally:
            sample = sampler.stop()
        rec = record(result, tool, failure, sample)
        unanswered = max(0, requests - result.requests)
        rec["failures"] = result.socket_errors + result.non_2xx_3xx + unanswered
        sent = result.sent or result.requests
        # The origin logs a miss just after answering it: wait for the misses the URL list
        # holds (none at 100 %), or for its log to stop growing. Only this point's URLs
        # count: a miss of the point before that the client left (wrk stops with requests
        # still out) reaches the log when PHP is done with it, which may be now.
        expected = sent // MISS_EVERY if p.get("hit_target") == 95 else 0
        mine = set(lines)
        origin = sum(proxycount.settle(lambda: proxycount.served_since(access, offset, only=mine),
                                       expected).values())
        rec.update({"content": p.get("content", "warm-up"), "hit_target": p.get("hit_target"),
                    "concurrency": p["concurrency"], "origin_requests": origin,
                    "hit_pct": 100.0 * (1 - origin / sent) if sent else None})
        return rec
