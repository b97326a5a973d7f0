"""h2load (nghttp2): a fixed number of requests (-n) over HTTP/1.1, keep-alive or a new
connection per request, or over HTTP/2 (ALPN h2 on an https URL) with -m streams per
connection; latency percentiles come from its per-request log file. Over TLS h2load reports
the negotiated protocol, cipher, key exchange and ALPN protocol, which the result keeps.
A new connection resumes the previous connection's TLS session when the server allows it."""

from __future__ import annotations

import os
import re
import tempfile

from arena.clients.base import LoadResult, ToolRun, run_tool, to_ms, tool_failed
from arena.stats import percentile
from arena.tools import require

TOOL = "h2load"


def command(url: str, connections: int, requests: int, close: bool = False,
            log_file: str | None = None, uris_file: str | None = None, http2: bool = False,
            streams: int = 1) -> list[str]:
    """With `uris_file` (absolute URIs, one per line) h2load ignores `url`: each connection
    requests those URIs in order, cycling, and the first requests % connections connections
    make one request more than the others. `http2`: offer only h2 (ALPN), `streams` at once
    on each connection."""
    cmd = [require(TOOL)] + (["--npn-list=h2"] if http2 else ["--h1"])
    cmd += ["-t", "1", "-c", str(connections), "-n", str(requests)]
    if streams > 1:
        cmd += ["-m", str(streams)]
    if close:
        cmd += ["-H", "Connection: close"]
    if log_file:
        cmd += ["--log-file", log_file]
    return cmd + (["-i", uris_file] if uris_file else [url])


def parse_log(text: str) -> dict[str, float]:
    """Percentiles (ms) of the per-request log: lines of `start_us status duration_us`."""
    durations = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            durations.append(int(parts[2]) / 1000)
    if not durations:
        return {}
    durations.sort()
    return {"p50": percentile(durations, 50, presorted=True),
            "p90": percentile(durations, 90, presorted=True),
            "p99": percentile(durations, 99, presorted=True),
            "max": durations[-1],
            "mean": sum(durations) / len(durations)}


def summary(text: str, res: LoadResult) -> None:
    """h2load's summary lines (`finished in`, `requests:`, `status codes:`) into `res`; h3load
    prints them in the same form."""
    fin = re.search(r"finished in ([\d.]+)(us|ms|s|m), ([\d.]+) req/s", text)
    if fin:
        res.duration_s = to_ms(fin.group(1), fin.group(2)) / 1000
        res.rps = float(fin.group(3))
    req = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", text)
    if req:
        total, started, done, ok, failed, errored, timeout = map(int, req.groups())
        res.requests = done
        res.sent = started
        # h2load counts as failed every request that did not end in a 2xx/3xx response,
        # including those never started; errored and timeout are the socket-level part.
        res.failures = failed
        res.socket_errors = errored + timeout
        res.extra["succeeded"] = ok
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    if codes:
        res.non_2xx_3xx = int(codes.group(3)) + int(codes.group(4))
        res.extra["status_2xx"] = int(codes.group(1))
        res.extra["status_3xx"] = int(codes.group(2))


def parse(text: str, log_text: str = "") -> LoadResult:
    res = LoadResult(tool=TOOL)
    summary(text, res)
    traffic = re.search(r"traffic: .*?\((\d+)\) total, .*?\((\d+)\) headers .*?, .*?\((\d+)\) data", text)
    if traffic:
        res.bytes_total, res.header_bytes, res.body_bytes = map(int, traffic.groups())
    res.latency_ms["mean"] = None
    mean = re.search(r"time for request:\s+\S+\s+(\S+)\s+(\S+)", text)
    if mean:
        for key, raw in (("max", mean.group(1)), ("mean", mean.group(2))):
            m = re.match(r"([\d.]+)(us|ms|s)", raw)
            if m:
                res.latency_ms[key] = to_ms(m.group(1), m.group(2))
    res.latency_ms.update(parse_log(log_text))
    # Over TLS (and the application protocol over cleartext too).
    for key, pattern in (("tls_protocol", r"^TLS Protocol: (\S+)"), ("tls_cipher", r"^Cipher: (\S+)"),
                         ("tls_key_exchange", r"^Server Temp Key: (.+?)\s*$"),
                         ("application_protocol", r"^Application protocol: (\S+)")):
        m = re.search(pattern, text, re.MULTILINE)
        if m:
            res.extra[key] = m.group(1)
    res.extra["connect_mean_ms"] = None
    conn = re.search(r"time for connect:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", text)
    if conn:
        res.extra["connect_mean_ms"] = to_ms(conn.group(1), conn.group(2))
    return res


def run(url: str, connections: int, requests: int, cpus: str, close: bool = False,
        tick=None, uris_file: str | None = None, http2: bool = False,
        streams: int = 1) -> tuple[LoadResult, ToolRun, str | None]:
    fd, log_path = tempfile.mkstemp(prefix="arena-h2load-", suffix=".log")
    os.close(fd)
    try:
        limit = max(30, requests // 100) + 30
        tool = run_tool(command(url, connections, requests, close, log_path, uris_file, http2, streams), cpus,
                        timeout=limit, tick=tick)
        with open(log_path) as f:
            log_text = f.read()
    finally:
        os.unlink(log_path)
    return parse(tool.stdout, log_text), tool, tool_failed(tool, TOOL)
