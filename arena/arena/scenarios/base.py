"""The scenario interface: a scenario names its points and measures one point on one server.

The runner (arena/runner.py) owns everything else - servers, warm-up, interleaved rounds,
statistics and output - so a new study is one new file in this package that subclasses
Scenario and is decorated with @register.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from arena.clients.base import LoadResult, ToolRun
from arena.measure import Sampler, TreeSample
from arena.servers.base import RunningServer, SiteOptions

CLIENT_BOUND_PCT = 90.0


@dataclass
class Point:
    """One measurement point of a scenario (e.g. wrk, keep-alive, 100 connections)."""
    key: str                       # unique within the scenario, stable across runs
    series: str                    # the line it belongs to in plots and tables
    x: float                       # its position on the plots' x axis
    params: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"key": self.key, "series": self.series, "x": self.x, "params": self.params}


@dataclass
class Options:
    """What the user chose on the command line."""
    quick: bool = False
    rounds: int = 3
    requests: int | None = None    # override of the per-point request count
    server_cpus: str = "0"
    client_cpus: str = "1"
    profile: str = "tuned"
    backend_cpus: str | None = None  # a scenario's back end (s4-proxy); None = the client CPUs
    # "http" (cleartext HTTP/1.1), "tls" (HTTPS/1.1), "h2" (HTTP/2 over TLS) or "h3" (HTTP/3
    # over QUIC): arena/tls.py.
    transport: str = "http"
    cert: str = "ecdsa"            # the test certificate's key: "ecdsa" (P-256) or "rsa" (2048)
    resumption: bool = False       # TLS: leave session resumption on in every server
    server_quota: float | None = None  # % of one CPU each server's process tree may use (arena/quota.py)
    # --points: shell patterns of the point keys to measure (e.g. "wrk/keepalive/*"); None = all
    points: tuple[str, ...] | None = None


@dataclass
class Context:
    options: Options
    files: dict[str, int]          # served file name -> size in bytes
    tick: Callable[[], None] | None = None
    cert: Path | None = None       # the run's TLS certificate (a --tls, --h2 or --h3 run)


class Scenario:
    name = ""
    title = ""
    study = ""                     # which study of STUDIES.md it reproduces
    description = ""
    tools: list[str] = []          # load tools it runs (checked before anything starts)
    x_label = "concurrency"
    # The transports it has variants for (arena/tls.py); --tls, --h2 and --h3 are refused elsewhere.
    transports: tuple[str, ...] = ("http",)
    # Columns of the per-server table in the study's own layout: (header, param or metric key).
    study_columns: list[tuple[str, str]] = []

    def site_options(self, options: Options) -> SiteOptions:
        return SiteOptions()

    def tools_for(self, options: Options) -> list[str]:
        """The load tools a run with `options` uses: checked before anything starts, their
        versions recorded."""
        return self.tools

    def prepare(self, options: Options, servers: list[str]) -> dict:
        """Called once per run before any server starts: set up what the scenario needs
        beyond the servers (an application, say), or raise an ArenaError that says which
        command to run. What it returns is recorded under "scenario" in environment.json."""
        return {}

    def finish(self) -> None:
        """Called once per run after the servers stopped, whatever happened (also when
        prepare() failed half-way): undo what prepare() changed."""

    def points(self, options: Options) -> list[Point]:
        raise NotImplementedError

    def selected(self, options: Options) -> list[Point]:
        """The points this run measures: all of them, or those `--points` names."""
        points = self.points(options)
        if options.points is None:
            return points
        return [p for p in points if any(fnmatch.fnmatchcase(p.key, pat) for pat in options.points)]

    def warmup(self, point: Point, options: Options) -> Point | None:
        """A short version of `point` run on every server before its rounds; None = none."""
        return None

    def probe_paths(self) -> list[str]:
        """Paths fetched once per server before the run to record headers and byte counts."""
        return ["/robots.txt"]

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        """Run `point` once against `server`; return a flat record (see record())."""
        raise NotImplementedError


def sampled(server: RunningServer, run: Callable[[], tuple[LoadResult, ToolRun, str | None]]):
    """Run a load while sampling the server's process tree."""
    sampler = Sampler(server.pid).start()
    try:
        result, tool, failure = run()
    finally:
        sample = sampler.stop()
    return result, tool, failure, sample


def record(result: LoadResult, tool: ToolRun | None, failure: str | None, sample: TreeSample,
           body_size: int | None = None, header_range: tuple[int, int] | None = None) -> dict:
    """The flat per-round record every scenario returns.

    `body_size` and `header_range` (the probe's header sizes for this path) let the record
    say whether every reply carried the right number of bytes.
    """
    served = result.sent if result.sent else result.requests
    # Requests still in flight when the client stopped (wrk's quota): their partial bodies are
    # in bytes_total, so per-reply figures are derived from bytes only when there were none.
    abandoned = max(0, (result.sent or 0) - result.requests)
    bytes_per_reply = None
    if result.requests and result.bytes_total and not abandoned:
        bytes_per_reply = result.bytes_total / result.requests
    header = None
    if result.requests and result.header_bytes is not None:
        header = result.header_bytes / result.requests
    elif bytes_per_reply is not None and body_size is not None:
        header = bytes_per_reply - body_size
    bytes_ok = None
    if body_size is not None and result.requests:
        if result.body_bytes is not None:
            bytes_ok = result.body_bytes == result.requests * body_size
        elif result.bytes_total is not None and header_range is not None:
            # Every completed reply is body + a header within the probed sizes; abandoned
            # ones add at most one reply each.
            low = result.requests * (body_size + header_range[0] - 16)
            high = (result.requests + abandoned) * (body_size + header_range[1] + 16)
            bytes_ok = low <= result.bytes_total <= high
    client_cpu = tool.cpu_percent if tool else None
    cpu_10k = sample.cpu_seconds / served * 10000 if served else None
    client_10k = tool.cpu_seconds / served * 10000 if tool and served else None
    lat = result.latency_ms
    return {
        "tool": result.tool,
        "requests": result.requests,
        "sent": result.sent,
        "duration_s": result.duration_s,
        "rps": result.rps,
        "p50_ms": lat.get("p50"),
        "p90_ms": lat.get("p90"),
        "p99_ms": lat.get("p99"),
        "max_ms": lat.get("max"),
        "mean_ms": lat.get("mean"),
        "failures": result.failures,
        "socket_errors": result.socket_errors,
        "non_2xx_3xx": result.non_2xx_3xx,
        "server_cpu_s": sample.cpu_seconds,
        "cpu_per_10k": cpu_10k,
        "kernel_cpu_per_10k": sample.kernel_seconds / served * 10000 if served else None,
        "peak_cpu_pct": sample.peak_cpu_percent,
        "peak_rss_mib": sample.peak_rss_kib / 1024,
        "peak_pss_mib": sample.peak_pss_kib / 1024,
        "server_processes": sample.peak_processes,
        "bytes_total": result.bytes_total,
        "bytes_per_reply": bytes_per_reply,
        "header_bytes": header,
        "body_size": body_size,
        "bytes_ok": bytes_ok,
        "client_cpu_pct": client_cpu,
        "client_bound": client_cpu is not None and client_cpu >= CLIENT_BOUND_PCT,
        "client_cpu_per_10k": client_10k,
        "pair_cpu_per_10k": cpu_10k + client_10k if client_10k is not None else None,
        "error": failure,
        "extra": result.extra,
    }
