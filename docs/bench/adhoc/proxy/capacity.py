"""Reverse proxy with kept upstream connections as capacity per core: gannet, nginx and
HAProxy (Debian's, `nbthread 1`, `http-reuse always`), and BASE (an older gannet build) if
given, each in its own cgroup v1 `cpu` group limited to 25% of CPU 0 (cfs_quota 2500 /
period 10000), one worker/thread, no access log, in front of one back end (Debian's nginx
serving a 97-byte JSON, backend.conf) on CPU 1; `wrk -t1 -c100` keep-alive on CPU 1, rounds
interleaved. Requests/s under the quota are requests per quarter CPU-second; each round
checks the quota throttled the proxy. Kept upstream connections: 256, more than the
client's 100: a throttled proxy has every client request in flight at once, and with fewer
kept connections (the ad hoc bench's 64) each request past them opens and closes an upstream
connection, which measures connection churn instead. Medians and ranges; the issue's targets are gannet
>= 1.3x HAProxy and >= 1.8x nginx.

  [BASE=/path/to/older/gannet] python3 docs/bench/adhoc/proxy/capacity.py [ROUNDS] [SECONDS]
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
GANNET = os.environ.get("GANNET", str(REPO / "target/release/gannet"))
BASE = os.environ.get("BASE")
CGROUP = Path("/sys/fs/cgroup/cpu")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SECONDS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
BACKEND = 18090

PROXY_HTTP = """
    access_log off;
    keepalive_requests 1000000;
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}
"""
NGINX_CONF = "worker_processes 1; daemon off; pid {tmp}/pid; error_log {tmp}/error.log error;\n" \
    "events {{ worker_connections 4096; }}\nhttp {{" + PROXY_HTTP + "}}\n"
HAPROXY_CONF = """global
    nbthread 1
    maxconn 4096
    pidfile {tmp}/pid
defaults
    mode http
    timeout connect 5s
    timeout client 65s
    timeout server 65s
    timeout http-keep-alive 65s
    http-reuse always
frontend web
    bind 127.0.0.1:{port}
    backlog 4096
    default_backend origin
backend origin
    server origin 127.0.0.1:{backend}
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
    raise RuntimeError(f"nothing listens on {port}")


def tree_cpu(pid: int, part: slice = slice(11, 13)) -> float:
    """CPU seconds of `pid` and its children so far (`part`: user and system time, or one)."""
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                      text=True).stdout.split()]
    total = 0
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(map(int, f[part]))
        except (OSError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


class Proxy:
    def __init__(self, name: str):
        self.name = name
        self.tmp = Path(tempfile.mkdtemp(prefix=f"pxcap-{name}-"))
        self.port = free_port()
        conf = self.tmp / "server.conf"
        if name == "haproxy":
            conf.write_text(HAPROXY_CONF.format(tmp=self.tmp, port=self.port, backend=BACKEND))
            cmd = f"haproxy -db -f {conf}"
        else:
            conf.write_text(NGINX_CONF.format(tmp=self.tmp, port=self.port, backend=BACKEND))
            binary = {"gannet": GANNET, "base": BASE, "nginx": "nginx"}[name]
            cmd = f"{binary} -p {self.tmp}/ -c {conf}"
        self.proc, self.group = start_limited(f"pxcap-{name}", cmd)
        wait_port(self.port)

    def throttled(self) -> int:
        return throttled(self.group)

    def close(self) -> None:
        stop_limited(self.proc, self.group, signal.SIGTERM if self.name != "nginx" else signal.SIGQUIT)
        shutil.rmtree(self.tmp, ignore_errors=True)


def start_limited(label: str, cmd: str) -> tuple[subprocess.Popen, Path]:
    """`cmd` on CPU 0 in a cgroup v1 `cpu` group of its own (`label`) limited to 25 % of a CPU:
    the server and every process it starts live in the group."""
    group = CGROUP / label
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("10000")
    (group / "cpu.cfs_quota_us").write_text("2500")
    proc = subprocess.Popen(["sh", "-c", f"echo $$ > {group}/cgroup.procs && exec taskset -c 0 {cmd}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, group


def throttled(group: Path) -> int:
    """How many periods the group's quota has cut short so far."""
    return int(re.search(r"nr_throttled (\d+)", (group / "cpu.stat").read_text())[1])


def stop_limited(proc: subprocess.Popen, group: Path, sig: int = signal.SIGTERM) -> None:
    proc.send_signal(sig)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    time.sleep(0.2)
    try:
        group.rmdir()
    except OSError:
        pass


def wrk(port: int) -> tuple[float, int]:
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c100", f"-d{SECONDS}s",
                          f"http://127.0.0.1:{port}/ad.json"],
                         capture_output=True, text=True, timeout=SECONDS + 30).stdout
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]), \
        (int(bad[1]) if bad else 0) + (sum(map(int, errors.groups())) if errors else 0)


def main() -> None:
    www = Path(tempfile.mkdtemp(prefix="pxcap-www-"))
    www.chmod(0o755)  # the back end's worker (nobody) reads the file
    shutil.copy(HERE / "ad.json", www / "ad.json")
    (www / "backend.conf").write_text((HERE / "backend.conf").read_text())
    backend = subprocess.Popen(["taskset", "-c", "1", "nginx", "-p", f"{www}/", "-c", f"{www}/backend.conf"],
                               cwd=www, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    names = ["gannet"] + (["base"] if BASE else []) + ["nginx", "haproxy"]
    proxies = {}
    got = {n: [] for n in names}
    failed = {n: 0 for n in names}
    used = {n: [] for n in names}
    system = {n: [] for n in names}
    backend_cpu = []
    try:
        wait_port(BACKEND)
        proxies = {n: Proxy(n) for n in names}
        for p in proxies.values():
            first = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                    f"http://127.0.0.1:{p.port}/ad.json"], capture_output=True, text=True)
            assert first.stdout == "200", f"{p.name} answers {first.stdout}: {sorted(p.tmp.iterdir())}"
        for _ in range(ROUNDS):
            for n, p in proxies.items():
                before, b0, t0 = p.throttled(), tree_cpu(backend.pid), time.monotonic()
                c0, s0 = tree_cpu(p.proc.pid), tree_cpu(p.proc.pid, slice(12, 13))
                rate, bad = wrk(p.port)
                spent = time.monotonic() - t0
                used[n].append((tree_cpu(p.proc.pid) - c0) / spent)
                system[n].append((tree_cpu(p.proc.pid, slice(12, 13)) - s0) / max(tree_cpu(p.proc.pid) - c0, 1e-9))
                backend_cpu.append((tree_cpu(backend.pid) - b0) / (time.monotonic() - t0))
                assert p.throttled() > before, f"{n}: the quota never throttled it"
                got[n].append(rate)
                failed[n] += bad
    finally:
        for p in proxies.values():
            p.close()
        backend.send_signal(signal.SIGQUIT)
        backend.wait(10)
        shutil.rmtree(www, ignore_errors=True)
    med = {n: statistics.median(r) for n, r in got.items()}
    for n, r in got.items():
        print(f"{n:8} median {med[n]:>9,.0f} req/s under 25% of a core (range {min(r):,.0f}-{max(r):,.0f}), "
              f"{failed[n]} failed; {ROUNDS} rounds of {SECONDS} s; CPU used {statistics.median(used[n]):.0%}, of it in the kernel {statistics.median(system[n]):.0%}")
    for n in names[1:]:
        print(f"gannet / {n}: {med['gannet'] / med[n]:.2f}x")
    print(f"back end CPU while measured: up to {max(backend_cpu):.0%} of CPU 1")


if __name__ == "__main__":
    main()
