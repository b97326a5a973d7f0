"""The cost of counting for the `metrics` page, as capacity per core: gannet with a
`metrics` location (so every request is counted) and without (nothing counted), each in
its own cgroup v1 `cpu` group limited to 25% of CPU 0 (cfs_quota 2500 / period 10000), one
worker, robots.txt over keep-alive from `wrk -t1 -c50` on CPU 1, rounds interleaved;
req/s under the quota are requests per quarter CPU-second. Medians and ranges.

  python3 docs/bench/adhoc/metrics/capacity.py [ROUNDS] [SECONDS]
"""
from __future__ import annotations

import os
import re
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
CGROUP = Path("/sys/fs/cgroup/cpu")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SECONDS = int(sys.argv[2]) if len(sys.argv) > 2 else 4

CONF = """
user root;
worker_processes 1;
pid {tmp}/pid;
error_log {tmp}/error.log error;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{port};
        root {tmp}/www;
        {extra}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int) -> None:
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError("no server")


class Server:
    def __init__(self, name: str, extra: str):
        self.tmp = Path(tempfile.mkdtemp(prefix=f"metrics-{name}-"))
        (self.tmp / "www").mkdir()
        (self.tmp / "www" / "robots.txt").write_text("User-agent: *\nDisallow:\n")
        self.port = free_port()
        (self.tmp / "gannet.conf").write_text(CONF.format(tmp=self.tmp, port=self.port, extra=extra))
        self.group = CGROUP / f"gannet-metrics-{name}"
        self.group.mkdir(exist_ok=True)
        (self.group / "cpu.cfs_period_us").write_text("10000")
        (self.group / "cpu.cfs_quota_us").write_text("2500")
        # The master and its worker process both start inside the group (taskset: CPU 0).
        self.proc = subprocess.Popen(
            ["sh", "-c", f"echo $$ > {self.group}/cgroup.procs && exec taskset -c 0 {GANNET} -c {self.tmp}/gannet.conf"])
        wait_port(self.port)

    def throttled(self) -> int:
        stat = (self.group / "cpu.stat").read_text()
        return int(re.search(r"nr_throttled (\d+)", stat)[1])

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        time.sleep(0.2)
        try:
            self.group.rmdir()
        except OSError:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def wrk(port: int) -> float:
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c50", f"-d{SECONDS}s", f"http://127.0.0.1:{port}/robots.txt"],
                         capture_output=True, text=True, timeout=SECONDS + 30).stdout
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])


def main() -> None:
    servers = {"on": Server("on", "location = /metrics { metrics; }"), "off": Server("off", "")}
    got = {k: [] for k in servers}
    try:
        for _ in range(ROUNDS):
            for name, srv in servers.items():
                before = srv.throttled()
                got[name].append(wrk(srv.port))
                assert srv.throttled() > before, f"{name}: the quota never throttled it"
    finally:
        for s in servers.values():
            s.close()
    for name, r in got.items():
        print(f"metrics {name:3}: median {statistics.median(r):,.0f} req/s under 25% of a core "
              f"(range {min(r):,.0f}-{max(r):,.0f}, {ROUNDS} rounds of {SECONDS} s)")
    print(f"on / off: {statistics.median(got['on']) / statistics.median(got['off']):.3f}")


if __name__ == "__main__":
    main()
