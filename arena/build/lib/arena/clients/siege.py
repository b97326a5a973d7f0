"""siege: study S3's concurrent-session sweep, benchmark mode (-b, no think time), a fixed
number of repetitions per simulated user, on one URL or a URL file (-f: each user goes through
the file in order from its own starting line). With `verbose`, siege prints one line per
transaction (status, seconds, body bytes, path), which transactions() reads."""

from __future__ import annotations

import json
import re

from arena.clients.base import LoadResult, ToolRun, run_tool, tool_failed
from arena.tools import require

TOOL = "siege"

_FIELDS = {
    "Transactions": "transactions", "Availability": "availability_pct", "Elapsed time": "elapsed_s",
    "Data transferred": "data_mb", "Response time": "response_s", "Transaction rate": "rate",
    "Throughput": "throughput_mb_s", "Concurrency": "concurrency",
    "Successful transactions": "successful", "Failed transactions": "failed",
    "Longest transaction": "longest_s", "Shortest transaction": "shortest_s",
}


def command(url: str | None, users: int, repetitions: int, rc_file: str = "/dev/null",
            urls_file: str | None = None, verbose: bool = False) -> list[str]:
    # --rc: never read (or create) the user's ~/.siege/siege.conf; runs must not depend on it.
    # Without -q siege 4.0 prints its summary (text, or JSON if the rc file sets json_output).
    cmd = [require(TOOL), f"--rc={rc_file}", "-b", "-c", str(users), "-r", str(repetitions)]
    if verbose:
        cmd.append("-v")
    return cmd + (["-f", urls_file] if urls_file else [url])


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TRANSACTION = re.compile(r"^HTTP/\d(?:\.\d)?\s+(\d{3})\s+([\d.]+) secs:\s+(\d+) bytes ==> (\S+)\s+(\S+)",
                          re.MULTILINE)


def transactions(text: str) -> list[tuple[int, float, int, str]]:
    """(status, seconds, body bytes, path) of every transaction line of a verbose run."""
    return [(int(m.group(1)), float(m.group(2)), int(m.group(3)), m.group(5))
            for m in _TRANSACTION.finditer(_ANSI.sub("", text))]


def _values(text: str) -> dict[str, float]:
    """Summary figures from siege's text summary or its JSON one (json_output = true)."""
    values: dict[str, float] = {}
    block = re.search(r"\{[^{}]*\"transactions\"[^{}]*\}", text)
    if block:
        data = json.loads(block.group(0))
        for label, key in _FIELDS.items():
            name = label.lower().replace(" ", "_")
            if name in data:
                values[key] = float(data[name])
        return values
    for label, key in _FIELDS.items():
        m = re.search(rf"^{label}:\s+([\d.]+)", text, re.MULTILINE)
        if m:
            values[key] = float(m.group(1))
    return values


def parse(text: str) -> LoadResult:
    res = LoadResult(tool=TOOL)
    values = _values(text)
    res.extra.update(values)
    res.requests = int(values.get("successful", values.get("transactions", 0)))
    res.duration_s = values.get("elapsed_s", 0.0)
    res.rps = values.get("rate", 0.0)
    res.failures = int(values.get("failed", 0))
    res.socket_errors = res.failures
    if "response_s" in values:
        res.latency_ms["mean"] = values["response_s"] * 1000
    if "longest_s" in values:
        res.latency_ms["max"] = values["longest_s"] * 1000
    if "data_mb" in values:
        res.bytes_total = int(values["data_mb"] * 1024 * 1024)
    lines = transactions(text)
    if lines:
        counts: dict[str, int] = {}
        for status, _, _, _ in lines:
            counts[str(status)] = counts.get(str(status), 0) + 1
        res.extra["status_counts"] = counts
        res.non_2xx_3xx = sum(n for code, n in counts.items() if not 200 <= int(code) < 400)
        # siege's own "failed" counts socket failures and 5xx answers (not 4xx): split it.
        fives = sum(n for code, n in counts.items() if int(code) >= 500)
        res.socket_errors = max(0, res.failures - fives)
        res.failures = res.socket_errors + res.non_2xx_3xx
    return res


def run(url: str | None, users: int, repetitions: int, cpus: str, tick=None, urls_file: str | None = None,
        verbose: bool = False) -> tuple[LoadResult, ToolRun, str | None]:
    tool = run_tool(command(url, users, repetitions, urls_file=urls_file, verbose=verbose), cpus,
                    timeout=60 + users * repetitions / 50, tick=tick)
    # siege prints its summary on stderr.
    return parse(tool.stderr + tool.stdout), tool, tool_failed(tool, TOOL)
