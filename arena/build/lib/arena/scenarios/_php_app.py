"""What the dynamic scenarios (s1-dynamic, s3-sessions) share: the Shakespeare app as a "php"
site (arena/servers/sites.py) behind the one PHP-FPM pool every server uses, the URL mix, and
the PHP tier measured beside the server. Not a scenario itself: it registers nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from arena import shakespeare
from arena.clients.base import LoadResult, ToolRun
from arena.measure import Sampler, TreeSample
from arena.scenarios.base import Options, Scenario
from arena.servers import sites
from arena.servers.base import RunningServer, SiteOptions

KIND = "php"
# Slack per reply on top of the probed head and framing sizes (a Date or chunk-size line one
# digit longer, say).
SLACK = 16


def _log(message: str) -> None:
    print(f"arena: {message}", file=sys.stderr, flush=True)


def keep_share(children: int, servers: list[str]) -> int:
    """How many FastCGI connections a server may keep: an equal share of the pool's children
    among the servers that use the pool. All servers of a run stay up while one is measured, so
    a server whose kept connections held more would leave the next one waiting for children.
    (Only tuned gannet keeps any: see the "php" kind in arena/servers/sites.py.)"""
    users = [s for s in servers if not sites.embeds_app(s, KIND)]
    return max(1, children // max(1, len(users)))


class PhpAppScenario(Scenario):
    """Base of the scenarios that serve the Shakespeare app."""

    def __init__(self) -> None:
        super().__init__()
        self.app: shakespeare.App | None = None

    def most_connections(self, options: Options) -> int:
        """The most client connections a point opens at once."""
        raise NotImplementedError

    def site_options(self, options: Options) -> SiteOptions:
        # Each client connection may hold a FastCGI connection too: the servers' limits are
        # sized for both.
        keep = self.app.record["fastcgi_keep"] if self.app else 1
        return SiteOptions(kind=KIND, docroot=shakespeare.DOCROOT,
                           app={"fastcgi_socket": shakespeare.SOCKET, "fastcgi_keep": keep},
                           connections=2 * self.most_connections(options) + 64)

    def prepare(self, options: Options, servers: list[str]) -> dict:
        from arena.runner import cpu_list  # here: the runner imports this package
        self.app = shakespeare.prepare(servers, KIND, cpu_list(options.server_cpus), log=_log)
        self.app.record["fastcgi_keep"] = keep_share(self.app.record["pool_children"], servers)
        return self.app.record

    def finish(self) -> None:
        shakespeare.finish(self.app)
        self.app = None

    def probe_paths(self) -> list[str]:
        return self.app.probe_paths() if self.app else ["/"]

    # -- helpers for measure() ---------------------------------------------------------------
    def urls_file(self, server: RunningServer, absolute: bool) -> Path:
        """The URL mix for this server: paths (wrk) or absolute URLs (h2load -i, siege -f)."""
        path = server.rundir / ("urls.txt" if absolute else "paths.txt")
        if not path.exists():
            shakespeare.write_urls(self.app.urls, path, server.url("") if absolute else "")
        return path

    def sampled(self, server: RunningServer, run: Callable[[], tuple[LoadResult, ToolRun, str | None]]):
        """Run a load while sampling the server's tree and, unless the server runs PHP itself,
        the PHP-FPM pool's (master and this pool's children) the same way."""
        embedded = sites.embeds_app(server.name, KIND)
        tier = self.app.tier
        samplers = [Sampler(server.pid)]
        if not embedded:
            samplers.append(Sampler(tier.master, pids=tier.pids))
        for s in samplers:
            s.start()
        try:
            result, tool, failure = run()
        finally:
            samples = [s.stop() for s in samplers]
        return result, tool, failure, samples[0], (samples[1] if len(samples) > 1 else None)

    @staticmethod
    def add_php(rec: dict, server_sample: TreeSample, php: TreeSample | None, served: int) -> None:
        """The PHP tier's figures, and server + PHP together (for mod_php: the server alone,
        PHP being inside it)."""
        rec["php_in_server"] = php is None
        php_cpu = php.cpu_seconds if php else 0.0
        rec.update({
            "php_cpu_s": php.cpu_seconds if php else None,
            "php_cpu_per_10k": php.cpu_seconds / served * 10000 if php and served else None,
            "php_peak_cpu_pct": php.peak_cpu_percent if php else None,
            "php_peak_rss_mib": php.peak_rss_kib / 1024 if php else None,
            "php_peak_pss_mib": php.peak_pss_kib / 1024 if php else None,
            "php_processes": php.peak_processes if php else None,
            "total_cpu_per_10k": (server_sample.cpu_seconds + php_cpu) / served * 10000 if served else None,
            "total_peak_pss_mib": (server_sample.peak_pss_kib + (php.peak_pss_kib if php else 0)) / 1024,
        })

    @staticmethod
    def overhead_range(server: RunningServer) -> tuple[int, int] | None:
        """Fewest and most bytes a probed reply carried besides its body (head, chunk framing)."""
        sizes = [p[f"wire_{mode}"] - p["body_bytes"] for p in server.probes.values()
                 for mode in ("keepalive", "close") if f"wire_{mode}" in p]
        return (min(sizes), max(sizes)) if sizes else None


# -- what the clients must have received -------------------------------------------------------

def cycle_counts(length: int, requests: int) -> list[int]:
    """How often each of `length` entries is used by `requests` requests cycling from the first."""
    full, rest = divmod(requests, length)
    return [full + (1 if i < rest else 0) for i in range(length)]


def h2load_bodies(sizes: list[int], requests: int, clients: int) -> int:
    """Body bytes h2load -i must receive: each client cycles through the list from its first
    line, and the first requests % clients clients make one request more."""
    each, extra = divmod(requests, clients)
    total = 0
    for client in range(clients):
        counts = cycle_counts(len(sizes), each + (1 if client < extra else 0))
        total += sum(c * s for c, s in zip(counts, sizes))
    return total


def _extreme(sizes: list[int], counts: list[int], n: int, largest: bool) -> int:
    """Sum of the n largest (or smallest) bodies among the requests sent."""
    total = 0
    for size, count in sorted(zip(sizes, counts), reverse=largest):
        take = min(n, count)
        total += take * size
        n -= take
        if n == 0:
            break
    return total


def wrk_bytes_bounds(sizes: list[int], sent: int, completed: int, overhead: tuple[int, int]) -> tuple[int, int]:
    """Bounds of the bytes wrk_paths.lua's run may read: the first `sent` requests of the
    cycle went out, `completed` of them were answered whole (which ones is up to the
    connections' timing), and the rest may have been read in part when wrk stopped."""
    counts = cycle_counts(len(sizes), sent)
    everything = sum(c * s for c, s in zip(counts, sizes))
    abandoned = max(0, sent - completed)
    low_body = everything - _extreme(sizes, counts, abandoned, largest=True)
    high_body = everything - _extreme(sizes, counts, abandoned, largest=False)
    partial = _extreme(sizes, counts, abandoned, largest=True) + abandoned * (overhead[1] + SLACK)
    low = low_body + completed * max(0, overhead[0] - SLACK)
    high = high_body + completed * (overhead[1] + SLACK) + partial
    return low, high
