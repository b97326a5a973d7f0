"""wrk as a load generator for tests that change processes under load (reloads, binary
upgrades): started in the background for a bounded time, its summary read at the end.

wrk prints a "Socket errors: connect N, read N, write N, timeout N" line only when one of
them is not zero, and "Non-2xx or 3xx responses: N" only when there were some; a reset or a
connection closed while a request waits for its answer is a read error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

WRK = shutil.which("wrk")


@dataclass
class Result:
    text: str
    requests: int
    errors: dict
    non2xx: int


def start(url: str, seconds: int, connections: int = 200, threads: int = 2) -> subprocess.Popen:
    """wrk on `url` for `seconds`. The per-request timeout is 5 s, not wrk's 2 s: the test
    machines are small and shared, and a slow answer is not what these tests look for (a
    request never answered still ends as a read error when its connection closes)."""
    return subprocess.Popen(
        [WRK, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 60) -> Result:
    """Wait for wrk's end (bounded: it stops by itself after its duration) and read its summary."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"wrk did not end:\n{out}") from None
    m = re.search(r"(\d+) requests in", out)
    assert m, f"no summary from wrk:\n{out}"
    errors = {}
    e = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if e:
        errors = {k: int(v) for k, v in zip(("connect", "read", "write", "timeout"), e.groups()) if int(v)}
    n = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return Result(out, int(m.group(1)), errors, int(n.group(1)) if n else 0)


def established(port: int) -> int:
    """Connections established to `port` on 127.0.0.1, server side, from /proc/net/tcp."""
    want = f"0100007F:{port:04X}"
    n = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[1] == want and f[3] == "01":
            n += 1
    return n
