"""Counting what a proxy lost (study S4): the requests the back end served, read from its
access log as the study did, against the requests the replay planned; the replayers' results
added up; and the TCP states of the proxy's and the back end's sockets (`ss -tan`), which the
study recorded at each traffic level.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from arena.clients.base import LoadResult

# The request line and status of a combined-format line.
_STATUS = re.compile(r'^\S+ \S+ \S+ \[[^]]+\] "([^"]*)" (\d{3}) ', re.MULTILINE)
# Requests that are not the replay's: readiness polls and health checks (gannet's and Caddy's
# active checks probe every back end, whichever proxy's point is running).
NOT_REPLAYED = ("/robots.txt",)


def access_statuses(text: str, skip_paths: tuple[str, ...] = (), only: set[str] | None = None) -> Counter:
    """Status code -> count over the complete lines of a combined-format access log (a line
    still being written has no newline yet), leaving out requests for `skip_paths` and, with
    `only`, every request whose target (path and query) is not in it."""
    counts: Counter = Counter()
    for request, status in _STATUS.findall(text[:text.rfind("\n") + 1]):
        parts = request.split()
        if len(parts) > 1 and parts[1].split("?")[0] in skip_paths:
            continue
        if only is not None and (len(parts) < 2 or parts[1] not in only):
            continue
        counts[status] += 1
    return counts


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def served_since(path: Path, offset: int, skip_paths: tuple[str, ...] = NOT_REPLAYED,
                 only: set[str] | None = None) -> Counter:
    """Statuses of the replayed requests logged after byte `offset` of the access log at `path`
    (with `only`: of those targets)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return access_statuses(f.read().decode("latin-1"), skip_paths, only)


def settle(count, target: int, quiet: float = 0.5, timeout: float = 5.0, interval: float = 0.05) -> Counter:
    """Poll `count()` (statuses -> n, read from an access log) until it holds `target`
    requests, or stops growing for `quiet` seconds, at most `timeout` seconds: requests a
    proxy still holds when the client finishes reach the back end's log a little later."""
    start = last_change = time.monotonic()
    counts = count()
    while sum(counts.values()) < target:
        now = time.monotonic()
        if now - last_change >= quiet or now - start >= timeout:
            break
        time.sleep(interval)  # poll interval under the deadline
        again = count()
        if sum(again.values()) != sum(counts.values()):
            last_change = time.monotonic()
        counts = again
    return counts


def loss(planned: int, served: int) -> tuple[int, float]:
    """Requests lost between the client and the back end, and their share in percent. A proxy
    that retries may make the back end serve more than was sent: that is no negative loss."""
    lost = max(0, planned - served)
    return lost, (100.0 * lost / planned if planned else 0.0)


def combine(results: list[LoadResult]) -> LoadResult:
    """Several replayers' results (running at the same time) as one: counts add up, the mean
    reply time is weighted by replies, max is the largest; the median is the median of the
    largest replayer (httperf reports no percentiles to merge)."""
    out = LoadResult(tool="httperf")
    replies = sum(r.requests for r in results)
    out.requests = replies
    out.sent = sum(r.sent or 0 for r in results)
    out.failures = sum(r.failures for r in results)
    out.socket_errors = sum(r.socket_errors for r in results)
    out.non_2xx_3xx = sum(r.non_2xx_3xx for r in results)
    out.duration_s = max((r.duration_s for r in results), default=0.0)
    out.rps = sum(r.rps for r in results)
    for key in ("bytes_total", "body_bytes", "header_bytes"):
        values = [getattr(r, key) for r in results]
        setattr(out, key, sum(values) if values and None not in values else None)
    means = [(r.latency_ms.get("mean"), r.requests) for r in results if r.latency_ms.get("mean") is not None]
    if replies and means:
        out.latency_ms["mean"] = sum(m * n for m, n in means) / replies
    maxima = [r.extra["connection_ms_max"] for r in results if "connection_ms_max" in r.extra]
    if maxima:
        out.latency_ms["max"] = max(maxima)
    largest = max(results, key=lambda r: r.sent or 0, default=None)
    if largest is not None and "connection_ms_median" in largest.extra:
        out.latency_ms["p50"] = largest.extra["connection_ms_median"]
    out.extra["status_2xx"] = sum(int(r.extra.get("status_2xx", 0)) for r in results)
    for key in ("client_timeout", "socket_timeout", "connrefused", "connreset", "fd_unavail"):
        out.extra[key] = sum(int(r.extra.get(key, 0)) for r in results)
    return out


def tcp_states(text: str, ports: set[int]) -> Counter:
    """State -> count of the `ss -Htan` lines whose local or peer port is one of `ports`."""
    counts: Counter = Counter()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5:
            continue
        local, peer = parts[3].rsplit(":", 1)[-1], parts[4].rsplit(":", 1)[-1]
        if (local.isdigit() and int(local) in ports) or (peer.isdigit() and int(peer) in ports):
            counts[parts[0]] += 1
    return counts


class TcpSampler:
    """The most sockets seen in each TCP state during a run, polled every `interval` s."""

    def __init__(self, ports: set[int], interval: float = 0.5):
        self.ports = ports
        self.interval = interval
        self.peak: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        done = subprocess.run(["ss", "-Htan"], capture_output=True, text=True, timeout=10)
        for state, n in tcp_states(done.stdout, self.ports).items():
            self.peak[state] = max(self.peak[state], n)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> "TcpSampler":
        self._thread.start()
        return self

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        self._sample()  # the end state: TIME-WAIT left behind
        return dict(sorted(self.peak.items()))
