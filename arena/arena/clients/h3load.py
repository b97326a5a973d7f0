"""h3load (arena/h3load, built from this repository): HTTP/3 over QUIC with h2load's options,
-n requests over -c connections with -m streams in flight on each, keep-alive (a connection the
server ends is made again). Debian's h2load is built without QUIC, hence a tool of our own.
It runs on one thread, as `h2load -t 1` does, and prints h2load's summary lines plus the
latency percentiles it computes itself (the arena's rule: linear interpolation between closest
ranks), so no per-request log is needed. With --cacert it verifies the server's certificate
against the run's own; bytes on the wire are the UDP payload received (QUIC packets whole),
header bytes the answers' fields as decoded (the h3 crate does not expose QPACK's size)."""

from __future__ import annotations

import re
from pathlib import Path

from arena.clients import h2load
from arena.clients.base import LoadResult, ToolRun, run_tool, tool_failed
from arena.tools import require

TOOL = "h3load"


def command(url: str, connections: int, requests: int, streams: int = 1, cafile: str | Path | None = None,
            timeout: int | None = None) -> list[str]:
    cmd = [require(TOOL), "-c", str(connections), "-n", str(requests), "-m", str(streams)]
    if cafile:
        cmd += ["--cacert", str(cafile)]
    if timeout:
        cmd += ["--timeout", str(timeout)]
    return cmd + [url]


def parse(text: str) -> LoadResult:
    res = LoadResult(tool=TOOL)
    # The summary lines are h2load's.
    h2load.summary(text, res)
    traffic = re.search(r"^traffic: (\d+) bytes body, (\d+) bytes headers \(decoded\), (\d+) bytes in (\d+) UDP "
                        r"datagrams", text, re.MULTILINE)
    if traffic:
        res.body_bytes, res.header_bytes, res.bytes_total, datagrams = map(int, traffic.groups())
        res.extra["udp_datagrams"] = datagrams
    res.latency_ms["mean"] = None
    lat = re.search(r"^latency ms: min ([\d.]+) p50 ([\d.]+) p90 ([\d.]+) p99 ([\d.]+) max ([\d.]+) mean ([\d.]+)",
                    text, re.MULTILINE)
    if lat:
        for key, value in zip(("p50", "p90", "p99", "max", "mean"), lat.groups()[1:]):
            res.latency_ms[key] = float(value)
    conns = re.search(r"^connections: (\d+) made, (\d+) failed; connect mean ([\d.]+) ms, max ([\d.]+) ms; "
                      r"(\d+) requests retried", text, re.MULTILINE)
    res.extra["connect_mean_ms"] = None
    if conns:
        res.extra["connections_made"] = int(conns.group(1))
        res.extra["connections_failed"] = int(conns.group(2))
        res.extra["connect_mean_ms"] = float(conns.group(3))
        res.extra["retried"] = int(conns.group(5))
    for key, pattern in (("tls_protocol", r"^TLS Protocol: (\S+)"),
                         ("application_protocol", r"^Application protocol: (\S+)"),
                         ("certificate", r"^Server certificate: (.+?)\s*$"),
                         ("first_error", r"^first error: (.+?)\s*$")):
        m = re.search(pattern, text, re.MULTILINE)
        if m:
            res.extra[key] = m.group(1)
    return res


def udp_receive_drops(snmp: str) -> int | None:
    """The kernel's count of UDP datagrams dropped for a full receive buffer (RcvbufErrors in
    /proc/net/snmp's text)."""
    lines = [line.split() for line in snmp.splitlines() if line.startswith("Udp:")]
    if len(lines) < 2 or "RcvbufErrors" not in lines[0]:
        return None
    return int(lines[1][lines[0].index("RcvbufErrors")])


def _drops_now() -> int | None:
    try:
        return udp_receive_drops(Path("/proc/net/snmp").read_text())
    except OSError:
        return None


def run(url: str, connections: int, requests: int, cpus: str, streams: int = 1, cafile: str | Path | None = None,
        tick=None) -> tuple[LoadResult, ToolRun, str | None]:
    limit = max(30, requests // 100) + 30
    before = _drops_now()
    tool = run_tool(command(url, connections, requests, streams, cafile), cpus, timeout=limit, tick=tick)
    after = _drops_now()
    res = parse(tool.stdout)
    # Datagrams the kernel dropped on this machine during the round (client's or server's
    # socket): QUIC recovers them, at a cost to both sides, so a round with many is suspect.
    res.extra["udp_receive_drops"] = after - before if before is not None and after is not None else None
    return res, tool, tool_failed(tool, TOOL)


def probe(url: str, cafile: str | Path, cpus: str, body_size: int | None = None) -> dict:
    """Two requests on one connection, the certificate verified against `cafile`: what the
    server negotiates over QUIC and whether it answers the path whole. "error" says what failed."""
    tool = run_tool(command(url, 1, 2, cafile=cafile, timeout=5), cpus, timeout=30)
    res = parse(tool.stdout)
    info = {"alpn": res.extra.get("application_protocol"), "protocol": res.extra.get("tls_protocol"),
            "verified": res.extra.get("certificate") == "verified", "status_2xx": res.extra.get("status_2xx"),
            "body_bytes": res.body_bytes, "error": tool_failed(tool, TOOL)}
    if info["error"] is None and (res.extra.get("status_2xx") != 2 or
                                  (body_size is not None and res.body_bytes != 2 * body_size)):
        info["error"] = (f"answered {res.extra.get('status_2xx')} of 2 requests with 2xx and {res.body_bytes} "
                         f"body bytes (expected {'?' if body_size is None else 2 * body_size})")
    return info
