"""Debian's `slowhttptest` against gannet at its default `worker_connections` (512): 1,000
slow connections on loopback in four seconds, with 5 s timeouts. Its CSV has, per second,
the connections closed, pending, connected (as the client sees them) and whether its probe
request was answered within 2 s. Each run ends when no connection is left or at its length.

Measured against nginx 1.22 with the same config (docs/modules/http_core.md, *Slow
clients*): the same seconds to the row for slow headers and slow bodies.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("slowhttptest") is None, reason="slowhttptest is not installed (scripts/test-all.sh installs it)")

CONF = """
worker_processes 1;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log warn;
events { }
http {
    access_log off;
    client_header_timeout 5s;
    client_body_timeout 5s;
    send_timeout 5s;
    keepalive_timeout 5s;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location = / { return 200 "ok\\n"; }
    }
}
"""

# 1,000 connections at 250 a second: all opened by second 4.
FLOOD = ["-c", "1000", "-r", "250", "-p", "2"]
OPENED = 4
TIMEOUT = 5


def run(srv, tmp_path, mode: list[str], length: int, path: str = "/") -> tuple[list[dict], int, bool]:
    """The CSV rows, the second the run ended, and whether it ended because no connection
    was left open (rather than at its length)."""
    prefix = tmp_path / "stats"
    r = subprocess.run(["slowhttptest", *mode, *FLOOD, "-l", str(length), "-g", "-o", str(prefix),
                        "-u", f"http://127.0.0.1:{srv.port}{path}"],
                       capture_output=True, text=True, timeout=length + 30, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with open(f"{prefix}.csv") as f:
        rows = [{k: int(v) for k, v in row.items()} for row in csv.DictReader(f)]
    ended = re.search(r"Test ended on (\d+)\w* second", r.stdout)
    assert rows and ended, r.stdout[-2000:]
    return rows, int(ended.group(1)), "No open connections left" in r.stdout


def assert_recovers(run_result, by: int) -> None:
    """Every slow connection closed, and the probe answered again, by second `by`."""
    rows, ended, all_closed = run_result
    assert all_closed and ended <= by, (ended, rows)
    down = [row["Seconds"] for row in rows if row["Service Available"] == 0]
    assert not down or down[-1] <= by, rows
    # The worker was full: some connections had to wait or were refused.
    assert max(row["Connected"] for row in rows) >= 500, rows


def test_slow_headers(gannet, tmp_path):
    # A header line every 2 s, well within the timeout per line: only client_header_timeout
    # bounding the whole head ends these.
    srv = gannet.start(conf=CONF)
    assert_recovers(run(srv, tmp_path, ["-H", "-i", "2"], 20), OPENED + TIMEOUT + 2)
    assert srv.get("/")[0] == 200


def test_slow_body(gannet, tmp_path):
    # A piece of body every 7 s, longer than client_body_timeout. (A body trickling faster
    # than the timeout is, in nginx too, kept for as long as it lasts.)
    srv = gannet.start(conf=CONF)
    # The last connections let in wait up to 7 s for their next piece.
    assert_recovers(run(srv, tmp_path, ["-B", "-i", "7", "-s", "8192"], 25), OPENED + TIMEOUT + 7 + 2)
    assert srv.get("/")[0] == 200


def test_slow_read(gannet, tmp_path):
    # Clients with a tiny window reading 32 bytes a second of a 1 MB file, three times per
    # connection. The file goes into the socket buffers without a write waiting 5 s, so
    # these stay (nginx keeps them too); what matters is that real clients are served.
    srv = gannet.start(conf=CONF, files={"big.bin": bytes(1 << 20)})
    rows, _, _ = run(srv, tmp_path, ["-X", "-n", "1", "-z", "32", "-w", "512", "-y", "1024", "-k", "3"], 12, "/big.bin")
    down = [row["Seconds"] for row in rows if row["Service Available"] == 0]
    assert not down or down[-1] <= OPENED + TIMEOUT + 2, rows
    assert srv.get("/")[0] == 200
