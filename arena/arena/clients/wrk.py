"""wrk: closed-loop throughput; a fixed request count via wrk_quota.lua; keep-alive or a new
connection per request (`Connection: close`, as weighttp and ab do by default)."""

from __future__ import annotations

import json
import re

from arena.clients.base import LoadResult, ToolRun, number, run_tool, script_path, to_bytes, to_ms, tool_failed
from arena.tools import require

TOOL = "wrk"


def command(url: str, connections: int, requests: int, close: bool = False,
            timeout_s: int = 5, max_seconds: int = 600, paths_file: str | None = None,
            headers: tuple[str, ...] = ()) -> list[str]:
    # One thread: the client has one CPU. The duration is only a safety bound; the Lua
    # script ends the run at `requests` completed responses. With `paths_file` (one path per
    # line) the requests cycle through those paths on `url`'s host (wrk_paths.lua).
    script = "wrk_paths.lua" if paths_file else "wrk_quota.lua"
    cmd = [require(TOOL), "-t", "1", "-c", str(connections), "-d", f"{max_seconds}s",
           "--timeout", f"{timeout_s}s", "--latency", "-s", str(script_path(script))]
    if close:
        cmd += ["-H", "Connection: close"]
    for header in headers:
        cmd += ["-H", header]
    return cmd + [url, "--", str(requests), str(connections)] + ([paths_file] if paths_file else [])


# wrk's kinds of socket error, in the order of its "Socket errors:" line.
SOCKET_ERRORS = ("connect", "read", "write", "timeout")


def parse(text: str) -> LoadResult:
    """Parse wrk's report; exact figures from the ARENA-JSON line when the script ran."""
    res = LoadResult(tool=TOOL)
    counts: dict[str, int] = {}
    summary = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m|h), ([\d.]+)([KMGT]?B) read", text)
    if summary:
        res.requests = int(summary.group(1))
        res.duration_s = to_ms(summary.group(2), summary.group(3)) / 1000
        res.bytes_total = to_bytes(summary.group(4), summary.group(5))
    lat = re.search(r"Latency\s+([\d.]+)(us|ms|s|m)\s+([\d.]+)(us|ms|s|m)\s+([\d.]+)(us|ms|s|m)", text)
    if lat:
        res.latency_ms["mean"] = to_ms(lat.group(1), lat.group(2))
        res.latency_ms["max"] = to_ms(lat.group(5), lat.group(6))
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.MULTILINE)
        if m:
            res.latency_ms[f"p{pct}"] = to_ms(m.group(1), m.group(2))
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if errors:
        counts = dict(zip(SOCKET_ERRORS, (int(g) for g in errors.groups())))
        res.socket_errors = sum(counts.values())
    res.non_2xx_3xx = number(r"Non-2xx or 3xx responses: (\d+)", text, int, 0)
    res.rps = number(r"Requests/sec:\s+([\d.]+)", text, float, 0.0)

    exact = re.search(r"^ARENA-JSON (\{.*\})\s*$", text, re.MULTILINE)
    if exact:
        data = json.loads(exact.group(1))
        err = data["errors"]
        res.requests = data["requests"]
        res.sent = data["sent"]
        res.bytes_total = data["bytes"]
        res.duration_s = data["duration_us"] / 1e6
        counts = {k: err[k] for k in SOCKET_ERRORS}
        res.socket_errors = sum(counts.values())
        # wrk_paths.lua counts every answer that is not 2xx; wrk itself only 4xx and 5xx.
        res.non_2xx_3xx = data.get("non_2xx", err["status"])
        res.latency_ms = {k: v / 1000 for k, v in data["latency_us"].items()}
        res.rps = res.requests / res.duration_s if res.duration_s else 0.0
    if res.socket_errors:
        # Which kind: a timeout says the server was slow, a read error that it reset or closed.
        res.extra["socket_errors"] = {k: v for k, v in counts.items() if v}
    res.failures = res.socket_errors + res.non_2xx_3xx
    return res


def run(url: str, connections: int, requests: int, cpus: str, close: bool = False, tick=None,
        paths_file: str | None = None, headers: tuple[str, ...] = ()) -> tuple[LoadResult, ToolRun, str | None]:
    # A bound, not a pace: at 500 req/s (slower than any peer manages here) the quota is
    # reached in time; a server that stops answering (lighttpd once it is out of
    # connections in c10k) ends the run instead of holding it for many minutes.
    max_seconds = max(60, requests // 500)
    cmd = command(url, connections, requests, close, max_seconds=max_seconds, paths_file=paths_file,
                  headers=headers)
    tool = run_tool(cmd, cpus, timeout=max_seconds + 30, tick=tick)
    return parse(tool.stdout), tool, tool_failed(tool, TOOL)
