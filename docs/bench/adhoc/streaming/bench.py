"""Streaming answers side by side, gannet and nginx (each one worker, pinned to CPU 0; this
script - upstream and clients - on CPU 1), rounds interleaved:

  events  Server-Sent Events through `proxy_pass`: STREAMS streams at once, EVENTS events
          each, one every GAP ms; each event carries the upstream's send time
          (CLOCK_MONOTONIC), the client notes its arrival: p50 / p99 / max of the delay,
          for `proxy_buffering off` and for the default `on`.
  slow    A 1 MB answer to CLIENTS clients that read 64 KiB every 100 ms (about 1.6 s per
          answer): how long each upstream connection stays open (accept to the proxy's
          close: read ahead frees it early) and the peak RSS of the server's processes.

The events' client is sse_client.c (compiled with cc on the fly; PYCLIENT=1 uses the Python
one instead). Usage (a release build of gannet; nginx from Debian):
  python3 docs/bench/adhoc/streaming/bench.py [events|slow|download|all] [ROUNDS]
  GANNET=/path/to/gannet STREAMS=100 EVENTS=100 GAP=50 CLIENTS=100 python3 ...
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
GANNET = os.environ.get("GANNET", str(REPO / "target/release/gannet"))
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
STREAMS = int(os.environ.get("STREAMS", "100"))
EVENTS = int(os.environ.get("EVENTS", "100"))
GAP = float(os.environ.get("GAP", "50")) / 1000
CLIENTS = int(os.environ.get("CLIENTS", "100"))
BIG = 1_000_000
HUGE = 1_000_000_000
SECONDS = float(os.environ.get("SECONDS", "20"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONF = """
worker_processes 1;
pid {tmp}/pid;
error_log {tmp}/error.log error;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /off {{ proxy_pass http://127.0.0.1:{up}; proxy_buffering off; }}
        location / {{ proxy_pass http://127.0.0.1:{up}; proxy_temp_path {tmp}/proxy_temp; }}
    }}
}}
"""


class Server:
    def __init__(self, name: str, up: int):
        self.name, self.port = name, free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"stream-{name}-"))
        # nginx's workers run as nobody (started as root without `user`): they must reach
        # the temp path nginx makes for them in here.
        self.tmp.chmod(0o755)
        conf = self.tmp / "server.conf"
        conf.write_text(CONF.format(tmp=self.tmp, port=self.port, up=up))
        if name == "nginx":
            cmd = [NGINX, "-p", f"{self.tmp}/", "-c", str(conf), "-g", "daemon off; master_process on;"]
        else:
            cmd = [GANNET, "-c", str(conf)]
        self.proc = subprocess.Popen(["taskset", "-c", "0", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"{name} did not start")

    def pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        return [self.proc.pid, *map(int, out)]

    def rss_kib(self, key: str = "VmRSS") -> int:
        total = 0
        for pid in self.pids():
            try:
                for line in open(f"/proc/{pid}/status"):
                    if line.startswith(key + ":"):
                        total += int(line.split()[1])
            except OSError:
                pass
        return total

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        errors = (self.tmp / "error.log").read_text(errors="replace") if (self.tmp / "error.log").exists() else ""
        if errors.strip():
            print(f"{self.name}'s error log:\n{errors[-2000:]}")
        shutil.rmtree(self.tmp, ignore_errors=True)


class Upstream:
    """One asyncio HTTP/1.1 server: `/events` and `/off/events` stream events, anything else
    is a 1 MB answer; notes how long each connection stayed open."""

    def __init__(self):
        self.held: list[float] = []
        self.sent = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened = time.monotonic()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b"\r\n", 1)[0]
            if b"/huge" in target:
                self.sent = 0
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE)
                block = b"x" * (1 << 20)
                while self.sent < HUGE:
                    writer.write(block)
                    await writer.drain()
                    self.sent += len(block)
                await reader.read()
            elif b"/events" in target:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(EVENTS):
                    data = b"data: %d %d\n\n" % (i, time.monotonic_ns())
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                    await asyncio.sleep(GAP)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
            else:
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG + b"x" * BIG)
                await writer.drain()
                await reader.read()  # until the proxy closes its side
                self.held.append(time.monotonic() - opened)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The run is over while a huge answer was still being sent.
            pass
        finally:
            writer.close()


async def one_stream(port: int, path: str, delays: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    buf = b""
    while True:
        got = await reader.read(65536)
        if not got:
            break
        now = time.monotonic_ns()
        buf += got
        while b"data: " in buf and b"\n\n" in buf[buf.index(b"data: "):]:
            start = buf.index(b"data: ")
            end = buf.index(b"\n\n", start)
            _, sent = buf[start + 6:end].split()
            delays.append((now - int(sent)) / 1e6)
            buf = buf[end + 2:]
    writer.close()


def build_client() -> str | None:
    """sse_client.c compiled (a C epoll client adds less to the tail than asyncio), or None
    without a C compiler (then the Python client is used)."""
    cc = shutil.which("cc")
    if cc is None:
        return None
    out = os.path.join(tempfile.gettempdir(), "gannet-sse-client")
    subprocess.run([cc, "-O2", "-o", out, str(Path(__file__).with_name("sse_client.c"))], check=True)
    return out


async def c_streams(client: str, port: int, path: str) -> list[float]:
    """STREAMS streams through the C client: each event's delay in ms."""
    proc = await asyncio.create_subprocess_exec(client, str(port), path, str(STREAMS),
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0, proc.returncode
    return [int(v) / 1000 for v in out.split()]


async def slow_client(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=64 * 1024)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    writer.write(b"GET /big HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    await writer.drain()
    got = 0
    while True:
        piece = await reader.read(64 * 1024)
        if not piece:
            break
        got += len(piece)
        await asyncio.sleep(0.1)
    writer.close()
    assert got > BIG, got


async def paced_client(port: int) -> int:
    """Reads the huge answer at 1 MB/s for SECONDS, then leaves: bytes read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
    writer.write(b"GET /huge HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    await writer.drain()
    got, end = 0, time.monotonic() + SECONDS
    while time.monotonic() < end:
        tick = time.monotonic()
        want = 1 << 20
        while want > 0:
            piece = await reader.read(min(want, 64 * 1024))
            if not piece:
                return got
            got += len(piece)
            want -= len(piece)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    writer.close()
    return got


async def with_peak_rss(s: Server, work):
    """`work`'s result, and the server's RSS growth over its run and RSS before (MiB)."""
    base = s.rss_kib()
    peak = [base]

    async def watch():
        while True:
            peak.append(s.rss_kib())
            await asyncio.sleep(0.05)
    w = asyncio.create_task(watch())
    try:
        out = await work
    finally:
        w.cancel()
    return out, (max(peak) - base) / 1024, base / 1024


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


async def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    os.sched_setaffinity(0, {1})
    client = build_client() if what in ("events", "all") and not os.environ.get("PYCLIENT") else None
    upstream = Upstream()
    up = await asyncio.start_server(upstream.serve, "127.0.0.1", 0, backlog=4096)
    up_port = up.sockets[0].getsockname()[1]
    servers = [Server("gannet", up_port), Server("nginx", up_port)]
    results: dict[str, list] = {}
    try:
        for r in range(rounds):
            for s in servers:
                if what in ("events", "all"):
                    for path in ("/off/events", "/events"):
                        delays: list[float] = []
                        if client:
                            delays = await c_streams(client, s.port, path)
                        else:
                            await asyncio.gather(*(one_stream(s.port, path, delays) for _ in range(STREAMS)))
                        assert len(delays) == STREAMS * EVENTS, (s.name, path, len(delays))
                        results.setdefault(f"{s.name} {path}", []).append(
                            (statistics.median(delays), pct(delays, 0.99), max(delays)))
                if what in ("slow", "all"):
                    upstream.held.clear()
                    _, growth, base = await with_peak_rss(
                        s, asyncio.gather(*(slow_client(s.port) for _ in range(CLIENTS))))
                    held = list(upstream.held)
                    results.setdefault(f"{s.name} slow", []).append(
                        (statistics.median(held), max(held), growth, base))
                if what in ("download", "all"):
                    got, growth, _ = await with_peak_rss(s, paced_client(s.port))
                    results.setdefault(f"{s.name} download", []).append(
                        (upstream.sent / 1e6, got / 1e6, growth))
    finally:
        for s in servers:
            s.stop()
        up.close()
    for key, rows in results.items():
        if key.endswith("download"):
            print(f"{key:22s} upstream sent {statistics.median(r[0] for r in rows):.0f} MB while the client read"
                  f" {statistics.median(r[1] for r in rows):.0f} MB; RSS growth median"
                  f" {statistics.median(r[2] for r in rows):.1f} MiB (rounds {', '.join(f'{r[2]:.1f}' for r in rows)})")
        elif key.endswith("slow"):
            print(f"{key:22s} upstream held median {statistics.median(r[0] for r in rows):.3f} s"
                  f" (rounds {', '.join(f'{r[0]:.3f}' for r in rows)}), max {max(r[1] for r in rows):.3f} s;"
                  f" RSS growth median {statistics.median(r[2] for r in rows):.1f} MiB"
                  f" (rounds {', '.join(f'{r[2]:.1f}' for r in rows)}) over {rows[0][3]:.1f} MiB idle")
        else:
            print(f"{key:22s} delay ms p50 {statistics.median(r[0] for r in rows):.2f}"
                  f" p99 {statistics.median(r[1] for r in rows):.2f} max {max(r[2] for r in rows):.2f}"
                  f" (p99 by round {', '.join(f'{r[1]:.2f}' for r in rows)})")


if __name__ == "__main__":
    asyncio.run(main())
