"""Builds complete results folders from known per-round figures, through the real writer, for
the statistics, report and compare tests (no server needed: the figures are the input)."""

from __future__ import annotations

from pathlib import Path

from arena import envinfo
from arena.clients.base import LoadResult, ToolRun
from arena.measure import TreeSample
from arena.output import RunFolder, write_run
from arena.scenarios import get
from arena.scenarios.base import Options, record
from arena.servers import SERVERS

SERVER_NAMES = ["gannet", "nginx"]


def sample(rps: float, cpu_s: float, requests: int = 1000, failures: int = 0, p99: float = 5.0) -> dict:
    result = LoadResult(tool="wrk", requests=requests, failures=failures, rps=rps,
                        duration_s=requests / rps, bytes_total=requests * (403456 + 240),
                        latency_ms={"p50": 1.0, "p90": 3.0, "p99": p99, "max": 9.0, "mean": 1.5})
    tool = ToolRun("", "", 0, cpu_seconds=0.2, wall_seconds=requests / rps, timed_out=False)
    tree = TreeSample(cpu_seconds=cpu_s, peak_cpu_percent=80.0, peak_rss_kib=8192, peak_pss_kib=4096,
                      peak_processes=2)
    return record(result, tool, None, tree, body_size=403456, header_range=(235, 245))


def build(folder: Path, rps_of: dict[str, list[float]], interrupted: bool = False, transport: str = "http") -> dict:
    """A quick s1-static run whose every point got, per server, one round per rps value."""
    scenario = get("s1-static")
    rounds = len(next(iter(rps_of.values())))
    options = Options(quick=True, rounds=rounds, transport=transport)
    points = scenario.points(options)
    samples = []
    for point in points:
        for server, values in rps_of.items():
            for rnd, rps in enumerate(values, 1):
                rec = sample(rps, cpu_s=100_000 / rps / 1000)
                rec.update({"server": server, "point": point.key, "round": rnd})
                samples.append(rec)
    environment = envinfo.collect([SERVERS[s] for s in rps_of], scenario.tools, options)
    environment["probes"] = {s: {"/img.jpg": {
        "status": 200, "body_bytes": 403456, "header_keepalive": 240, "header_close": 235,
        "header_min": 235, "header_max": 240,
        "headers_keepalive": f"HTTP/1.1 200 OK\r\nServer: {s}\r\nContent-Length: 403456",
        "headers_close": "HTTP/1.1 200 OK"}} for s in rps_of}
    run = RunFolder(folder)
    run.create()
    results = write_run(run, scenario=scenario, options=options, servers=list(rps_of), points=points,
                        samples=samples, environment=environment, started=0.0, finished=60.0,
                        interrupted=interrupted)
    run.finish()
    return results
