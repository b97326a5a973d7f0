"""The floor on epoll (the arena's floor.c), the floor on io_uring (floor-uring.c: the same
answers, each send linked to the next receive and submitted in batches) and gannet, as
capacity per core on robots.txt over kept connections: each in its own cgroup v1 `cpu` group
limited to 25 % of CPU 0 (cfs_quota 2500 / period 10000), `wrk -t1` on CPU 1 at each
concurrency, rounds interleaved (each round starting with the next server). Requests/s under
the quota are requests per quarter CPU-second; each round checks the quota throttled the
server. Besides the medians, each server's rate over the floor's in the same round: this
machine's speed drifts over seconds, and the round-by-round ratio is the steadier figure.
Also the server's and the client's CPU together per answer (on loopback part of the
kernel's work for a server's segments runs in the client's context).

Issue 30's question: would a batched io_uring loop take enough off the kernel's part of a
kept request to be worth building under gannet? EXTRA="name=/path/to/binary,..." adds
other floors built elsewhere (same command line: HOST PORT DOCROOT), e.g. the floor before
it stopped re-arming epoll after every answer (`git show 393279a:arena/arena/servers/floor.c`).

  GANNET=/path/to/gannet [EXTRA=...] python3 docs/bench/adhoc/cost/floors.py [ROUNDS] [SECONDS] [CONNS...]
Needs: cc, liburing-dev, wrk.
"""
from __future__ import annotations

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(HERE.parent / "proxy"))
from capacity import free_port, start_limited, stop_limited, throttled, tree_cpu, wait_port  # noqa: E402

GANNET = os.environ.get("GANNET", str(REPO / "target/release/gannet"))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SECONDS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
CONNS = [int(c) for c in sys.argv[3:]] or [100, 1000]


class Server:
    def __init__(self, name: str, work: Path, binaries: dict[str, str]):
        self.port = free_port()
        if name == "gannet":
            conf = (HERE / "gannet-small-static.conf").read_text()
            conf = conf.replace("WORK", str(work)).replace("PORT", str(self.port)) \
                .replace("MIME", str(REPO / "conf/mime.types")).replace("master_process off;", "")
            path = work / f"gannet-{self.port}.conf"
            path.write_text(conf)
            cmd = f"{GANNET} -p {work}/ -c {path}"
        else:
            cmd = f"{binaries[name]} 127.0.0.1 {self.port} {work}/www"
        self.proc, self.group = start_limited(f"floors-{name}", cmd)
        wait_port(self.port)

    def throttled(self) -> int:
        return throttled(self.group)

    def close(self) -> None:
        stop_limited(self.proc, self.group)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wrk(port: int, conns: int) -> tuple[float, int, int, float]:
    """Requests/s, failures, answers and wrk's own CPU seconds (user and system: on loopback
    the kernel's work for the server's segments partly runs in the client's context)."""
    c0 = children_cpu()
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{SECONDS}s", "--timeout", "5s",
                          f"http://127.0.0.1:{port}/robots.txt"],
                         capture_output=True, text=True, timeout=SECONDS + 30).stdout
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]), \
        (int(bad[1]) if bad else 0) + (sum(map(int, errors.groups())) if errors else 0), \
        int(re.search(r"(\d+) requests in", out)[1]), children_cpu() - c0


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="floors-"))
    work.chmod(0o755)  # gannet's worker (nobody) reads the file
    (work / "www").mkdir()
    shutil.copy(HERE.parent / "robots/robots.txt", work / "www/robots.txt")
    binaries = {"floor": str(work / "floor"), "floor-uring": str(work / "floor-uring")}
    subprocess.run(["cc", "-O2", "-o", binaries["floor"], str(REPO / "arena/arena/servers/floor.c")], check=True)
    subprocess.run(["cc", "-O2", "-o", binaries["floor-uring"], str(HERE / "floor-uring.c"), "-luring"], check=True)
    names = ["gannet", "floor", "floor-uring"]
    for spec in filter(None, os.environ.get("EXTRA", "").split(",")):
        name, binary = spec.split("=")
        binaries[name] = binary
        names.append(name)
    servers = {}
    got = {(n, c): [] for n in names for c in CONNS}
    kernel = {(n, c): [] for n in names for c in CONNS}
    pair = {(n, c): [] for n in names for c in CONNS}
    failed = {n: 0 for n in names}
    try:
        servers = {n: Server(n, work, binaries) for n in names}
        for i in range(ROUNDS):
            for c in CONNS:
                # Each round starts with the next server: none is always measured first.
                order = names[i % len(names):] + names[:i % len(names)]
                for n, s in ((n, servers[n]) for n in order):
                    before = s.throttled()
                    c0, s0 = tree_cpu(s.proc.pid), tree_cpu(s.proc.pid, slice(12, 13))
                    rate, bad, answers, client = wrk(s.port, c)
                    server = tree_cpu(s.proc.pid) - c0
                    kernel[n, c].append((tree_cpu(s.proc.pid, slice(12, 13)) - s0) / max(server, 1e-9))
                    pair[n, c].append((server + client) / answers * 1e6)
                    assert s.throttled() > before, f"{n}: the quota never throttled it"
                    got[n, c].append(rate)
                    failed[n] += bad
    finally:
        for s in servers.values():
            s.close()
        shutil.rmtree(work, ignore_errors=True)
    for c in CONNS:
        med = {n: statistics.median(got[n, c]) for n in names}
        for n in names:
            r = got[n, c]
            print(f"c={c:<5} {n:12} median {med[n]:>9,.0f} req/s under 25% of a core (range {min(r):,.0f}-{max(r):,.0f}),"
                  f" of its CPU in the kernel {statistics.median(kernel[n, c]):.0%};"
                  f" server + client CPU per answer {statistics.median(pair[n, c]):.1f} us")
        # The machine's speed drifts over seconds: each round's ratio to the floor's rate in
        # the same round (the servers run back to back) is steadier than a ratio of medians.
        for n in names:
            if n != "floor":
                paired = sorted(a / b for a, b in zip(got[n, c], got["floor", c]))
                print(f"c={c:<5} {n:12} / floor, round by round: median {statistics.median(paired):.2f}x "
                      f"(range {paired[0]:.2f}-{paired[-1]:.2f}); of the medians {med[n] / med['floor']:.2f}x")
    print(f"failed: {failed}; {ROUNDS} rounds of {SECONDS} s")


if __name__ == "__main__":
    main()
