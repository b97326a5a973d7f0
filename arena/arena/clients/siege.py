"""siege: study S3's concurrent-session sweep (for the dynamic scenarios to come), benchmark
mode (-b, no think time), a fixed number of repetitions per simulated user."""

from __future__ import annotations

import json
import re

from arena.clients.base import LoadResult, ToolRun, number, run_tool, tool_failed
from arena.tools import require

TOOL = "siege"

_FIELDS = {
    "Transactions": "transactions", "Availability": "availability_pct", "Elapsed time": "elapsed_s",
    "Data transferred": "data_mb", "Response time": "response_s", "Transaction rate": "rate",
    "Throughput": "throughput_mb_s", "Concurrency": "concurrency",
    "Successful transactions": "successful", "Failed transactions": "failed",
    "Longest transaction": "longest_s", "Shortest transaction": "shortest_s",
}


def command(url: str, users: int, repetitions: int, rc_file: str = "/dev/null") -> list[str]:
    # --rc: never read (or create) the user's ~/.siege/siege.conf; runs must not depend on it.
    # Without -q siege 4.0 prints its summary (text, or JSON if the rc file sets json_output).
    return [require(TOOL), f"--rc={rc_file}", "-b", "-c", str(users), "-r", str(repetitions), url]


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
    return res


def run(url: str, users: int, repetitions: int, cpus: str, tick=None) -> tuple[LoadResult, ToolRun, str | None]:
    tool = run_tool(command(url, users, repetitions), cpus, timeout=60 + users * repetitions / 50, tick=tick)
    # siege prints its summary on stderr.
    return parse(tool.stderr + tool.stdout), tool, tool_failed(tool, TOOL)
