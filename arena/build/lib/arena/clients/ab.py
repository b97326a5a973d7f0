"""ab (ApacheBench): study S5's response time against the number of requests, at a given
concurrency; HTTP/1.0 and a new connection per request unless keep-alive (-k) is asked.
Percentiles come from its -e CSV (fractional milliseconds) rather than its rounded table."""

from __future__ import annotations

import os
import re
import tempfile

from arena.clients.base import LoadResult, ToolRun, number, run_tool, tool_failed
from arena.tools import require

TOOL = "ab"


def command(url: str, connections: int, requests: int, keepalive: bool = False,
            csv_file: str | None = None, timeout_s: int = 5) -> list[str]:
    # -r: keep going on socket receive errors (count them instead of aborting the run).
    cmd = [require(TOOL), "-r", "-s", str(timeout_s), "-n", str(requests), "-c", str(connections)]
    if keepalive:
        cmd.append("-k")
    if csv_file:
        cmd += ["-e", csv_file]
    return cmd + [url]


def parse_csv(text: str) -> dict[int, float]:
    """ab -e output: 'Percentage served,Time in ms' then one line per percent 0..99."""
    out = {}
    for line in text.splitlines()[1:]:
        pct, _, ms = line.partition(",")
        try:
            out[int(pct)] = float(ms)
        except ValueError:
            continue
    return out


def parse(text: str, csv_text: str = "") -> LoadResult:
    res = LoadResult(tool=TOOL)
    res.requests = number(r"^Complete requests:\s+(\d+)", text, int, 0)
    res.duration_s = number(r"^Time taken for tests:\s+([\d.]+) seconds", text, float, 0.0)
    res.rps = number(r"^Requests per second:\s+([\d.]+)", text, float, 0.0)
    failed = number(r"^Failed requests:\s+(\d+)", text, int, 0)
    breakdown = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: (\d+), Exceptions: (\d+)\)", text)
    if breakdown:
        connect, receive, length, exceptions = map(int, breakdown.groups())
        res.socket_errors = connect + receive + exceptions
        res.extra["length_mismatches"] = length
    else:
        res.socket_errors = failed
    res.non_2xx_3xx = number(r"^Non-2xx responses:\s+(\d+)", text, int, 0)
    # A length mismatch on a static file is a wrong reply, so every "failed" ab request counts.
    res.failures = failed + res.non_2xx_3xx
    res.bytes_total = number(r"^Total transferred:\s+(\d+) bytes", text, int)
    res.body_bytes = number(r"^HTML transferred:\s+(\d+) bytes", text, int)
    if res.bytes_total is not None and res.body_bytes is not None:
        res.header_bytes = res.bytes_total - res.body_bytes
    res.extra["server_software"] = number(r"^Server Software:\s+(.*)$", text, str)
    res.extra["document_length"] = number(r"^Document Length:\s+(\d+) bytes", text, int)
    res.extra["keepalive_requests"] = number(r"^Keep-Alive requests:\s+(\d+)", text, int)
    res.latency_ms["mean"] = number(r"^Time per request:\s+([\d.]+) \[ms\] \(mean\)$", text, float)
    table = dict((int(p), float(v)) for p, v in re.findall(r"^\s+(\d+)%\s+(\d+)", text, re.MULTILINE))
    pcts = parse_csv(csv_text) or table
    for p in (50, 90, 99):
        res.latency_ms[f"p{p}"] = pcts.get(p)
    res.latency_ms["max"] = table.get(100)
    return res


def run(url: str, connections: int, requests: int, cpus: str, keepalive: bool = False,
        tick=None) -> tuple[LoadResult, ToolRun, str | None]:
    fd, csv_path = tempfile.mkstemp(prefix="arena-ab-", suffix=".csv")
    os.close(fd)
    try:
        limit = max(30, requests // 50) + 30
        tool = run_tool(command(url, connections, requests, keepalive, csv_path), cpus, timeout=limit, tick=tick)
        with open(csv_path) as f:
            csv_text = f.read()
    finally:
        os.unlink(csv_path)
    return parse(tool.stdout, csv_text), tool, tool_failed(tool, TOOL)
