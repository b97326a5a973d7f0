"""httperf: study S2's open-loop rate sweep - new connections at a fixed --rate, each making
--num-calls requests - reporting reply rate, response time and bytes per reply; and study S4's
replay of a request log (--wsesslog: sessions started at a fixed --rate, each request with its
own method and body), several runs at once, one per header set."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from arena.clients.base import LoadResult, ToolRun, number, run_tool, tool_failed
from arena.tools import require

TOOL = "httperf"
# httperf reads at most this many sessions from a --wsesslog file (and cycles through them).
MAX_SESSIONS = 1000


def command(host: str, port: int, uri: str, rate: float, num_conns: int, num_calls: int = 10,
            timeout_s: float = 5, headers: list[str] | None = None) -> list[str]:
    cmd = [require(TOOL), "--hog", "--server", host, "--port", str(port), "--uri", uri,
           "--rate", f"{rate:g}", "--num-conns", str(num_conns), "--num-calls", str(num_calls),
           "--timeout", f"{timeout_s:g}"]
    for header in headers or []:
        # httperf expands the two characters backslash-n itself into a proper line end; a raw
        # newline passed here reaches the server as a bare LF, which lighttpd answers with 400.
        cmd += ["--add-header", header + "\\n"]
    return cmd


def sessions_command(host: str, port: int, session_file: str, sessions: int, rate: float,
                     timeout_s: float = 5, headers: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Replay `session_file` (wsesslog format): `sessions` sessions at `rate` per second,
    cycling through the file's sessions; no think time.

    No --hog: with it httperf binds each client port itself, sweeping 1024-65535, and once
    TIME-WAIT holds the ports it sweeps it retries bind() forever (arena/tcptune.py). Without
    it the kernel picks the port, reusing TIME-WAIT ones where tcp_tw_reuse allows, and a
    connection that finds none fails (counted as addrunavail) instead of hanging the run."""
    cmd = [require(TOOL), "--server", host, "--port", str(port), "--rate", f"{rate:g}",
           "--wsesslog", f"{sessions},0,{session_file}", "--timeout", f"{timeout_s:g}"]
    for header in headers:
        cmd += ["--add-header", header + "\\n"]
    return cmd


def parse(text: str) -> LoadResult:
    res = LoadResult(tool=TOOL)
    total = re.search(r"^Total: connections (\d+) requests (\d+) replies (\d+) test-duration ([\d.]+) s",
                      text, re.MULTILINE)
    if total:
        conns, requests, replies, duration = total.groups()
        res.sent = int(requests)
        res.requests = int(replies)
        res.duration_s = float(duration)
        res.extra["connections"] = int(conns)
    rate = re.search(r"^Reply rate \[replies/s\]: min ([\d.]+) avg ([\d.]+) max ([\d.]+) stddev ([\d.]+) "
                     r"\((\d+) samples\)", text, re.MULTILINE)
    if rate:
        for key, value in zip(("min", "avg", "max", "stddev"), rate.groups()[:4]):
            res.extra[f"reply_rate_{key}"] = float(value)
        res.extra["reply_rate_samples"] = int(rate.group(5))
    res.rps = res.requests / res.duration_s if res.duration_s else 0.0
    reply = re.search(r"^Reply time \[ms\]: response ([\d.]+) transfer ([\d.]+)", text, re.MULTILINE)
    if reply:
        res.latency_ms["mean"] = float(reply.group(1)) + float(reply.group(2))
        res.extra["response_ms"] = float(reply.group(1))
        res.extra["transfer_ms"] = float(reply.group(2))
    size = re.search(r"^Reply size \[B\]: header ([\d.]+) content ([\d.]+) footer ([\d.]+) \(total ([\d.]+)\)",
                     text, re.MULTILINE)
    if size:
        header, content, footer, per_reply = map(float, size.groups())
        res.header_bytes = round(header * res.requests)
        res.body_bytes = round(content * res.requests)
        res.bytes_total = round(per_reply * res.requests)
    status = re.search(r"^Reply status: 1xx=(\d+) 2xx=(\d+) 3xx=(\d+) 4xx=(\d+) 5xx=(\d+)", text, re.MULTILINE)
    if status:
        res.non_2xx_3xx = int(status.group(4)) + int(status.group(5))
        res.extra["status_2xx"] = int(status.group(2))
    conn = re.search(r"^Connection time \[ms\]: min ([\d.]+) avg ([\d.]+) max ([\d.]+) median ([\d.]+)",
                     text, re.MULTILINE)
    if conn:
        for key, value in zip(("min", "avg", "max", "median"), conn.groups()):
            res.extra[f"connection_ms_{key}"] = float(value)
    res.socket_errors = number(r"^Errors: total (\d+)", text, int, 0)
    errors = re.search(r"^Errors: total \d+ client-timo (\d+) socket-timo (\d+) connrefused (\d+) connreset (\d+)",
                       text, re.MULTILINE)
    if errors:
        for key, value in zip(("client_timeout", "socket_timeout", "connrefused", "connreset"), errors.groups()):
            res.extra[key] = int(value)
    more = re.search(r"^Errors: fd-unavail (\d+) addrunavail (\d+) ftab-full (\d+) other (\d+)", text, re.MULTILINE)
    if more:
        for key, value in zip(("fd_unavail", "addrunavail", "ftab_full", "other_errors"), more.groups()):
            res.extra[key] = int(value)
    res.extra["net_io_kb_s"] = number(r"^Net I/O: ([\d.]+) KB/s", text, float)
    res.extra["client_cpu_total_pct"] = number(r"^CPU time \[s\]: .*total ([\d.]+)%\)", text, float)
    # A request that got no reply (the connection died first) is a failure too.
    missing = max(0, (res.sent or 0) - res.requests - res.non_2xx_3xx)
    res.failures = max(res.socket_errors, missing) + res.non_2xx_3xx
    return res


def run(host: str, port: int, uri: str, rate: float, num_conns: int, cpus: str, num_calls: int = 10,
        headers: list[str] | None = None, tick=None) -> tuple[LoadResult, ToolRun, str | None]:
    limit = num_conns / rate + 60
    tool = run_tool(command(host, port, uri, rate, num_conns, num_calls, headers=headers), cpus,
                    timeout=limit, tick=tick)
    return parse(tool.stdout), tool, tool_failed(tool, TOOL)


@dataclass(frozen=True)
class Replay:
    """One httperf replaying a session file: `sessions` sessions at `rate` per second, each
    request with `headers`; `name` says which part of the traffic it carries."""
    name: str
    session_file: str
    sessions: int
    rate: float
    headers: tuple[str, ...] = ()


@dataclass
class ReplayResult:
    replay: Replay
    result: LoadResult
    tool: ToolRun
    failure: str | None

    @property
    def stalled(self) -> bool:
        """httperf was still running at its deadline (never a server's doing: with the
        server silent, its --timeout ends every session in time)."""
        return self.tool.timed_out


# A replay's deadline: its planned duration with room for a client slowed by a busy CPU,
# plus httperf's own --timeout for the last sessions, plus a margin.
DEADLINE_FACTOR = 2.0
DEADLINE_MARGIN_S = 10.0
# After SIGINT at the deadline, how long httperf gets to print its statistics and exit.
INTERRUPT_GRACE_S = 5.0


def deadline(replay: Replay, timeout_s: float) -> float:
    return replay.sessions / replay.rate * DEADLINE_FACTOR + timeout_s + DEADLINE_MARGIN_S


def run_sessions(host: str, port: int, replays: list[Replay], cpus: str, timeout_s: float = 5,
                 deadline_s: float | None = None) -> list[ReplayResult]:
    """Run one httperf per replay at the same time, all pinned to `cpus`, and return each
    one's result in the same order. One still running at its deadline (`deadline_s`, or
    deadline()) is stopped with SIGINT so its counts so far are kept, and marked stalled."""
    results: list = [None] * len(replays)

    def one(i: int, replay: Replay) -> None:
        cmd = sessions_command(host, port, replay.session_file, replay.sessions, replay.rate, timeout_s,
                               replay.headers)
        tool = run_tool(cmd, cpus, timeout=deadline_s if deadline_s is not None else deadline(replay, timeout_s),
                        interrupt_grace=INTERRUPT_GRACE_S)
        results[i] = ReplayResult(replay, parse(tool.stdout), tool, tool_failed(tool, TOOL))

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(replays)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
