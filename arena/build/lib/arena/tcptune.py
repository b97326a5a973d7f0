"""Client ports for replays that open thousands of new connections per second (s4-proxy and
its variants): the kernel settings they need, and a check before each point that enough
ports are free for it.

Why: each replayed request is a new connection, and a closed connection keeps its client
port in TIME-WAIT for 60 s. A point at 2,000 requests/s for 10 s opens 20,000 connections,
and the points of all servers follow each other within that minute. httperf's `--hog`
made this fatal: it binds every client port itself, sweeping 1024-65535 in its own order,
and bind() fails for a port still in TIME-WAIT whatever `tcp_tw_reuse` says (that setting
only applies to ports the kernel picks in connect()). Once its sweep found no free port it
retried bind() forever and never finished. The replay now lets the kernel pick the port
(no `--hog`): from `net.ipv4.ip_local_port_range`, reusing a TIME-WAIT port for the same
destination once a second has passed when `net.ipv4.tcp_tw_reuse` allows it (1, or 2 -
Linux's default - for loopback, where all the arena's traffic runs), and failing connect()
with EADDRNOTAVAIL, which httperf counts and moves on from, when none is left.

As the study did ("tuned sysctl"), a run as root widens the range and turns reuse on for
its duration (`tune()`), records the values before and during the run, and puts the old
ones back at the end (`Tuning.restore()`). Before each point `wait_for_ports()` polls the
TIME-WAIT sockets (`ss -tan state time-wait`) until the point's connections fit, or gives
up with a message that says what to change.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from arena.errors import ArenaError

PROC_SYS = Path("/proc/sys")
PORT_RANGE = "net.ipv4.ip_local_port_range"
TW_REUSE = "net.ipv4.tcp_tw_reuse"
# The classic tuned value: 64,000 client ports. Ports above 65000 stay outside it, so a back
# end listening there can always be restarted on its port (no client connection can hold it).
WIDE_RANGE = (1024, 65000)
# How long a closed connection's port stays in TIME-WAIT (Linux's TCP_TIMEWAIT_LEN).
TIME_WAIT_S = 60
# With tcp_tw_reuse the kernel reuses a TIME-WAIT port for the same destination once the
# second it was last used in has passed: ports needed at once are about those opened within
# this window (twice that second, for margin).
REUSE_WINDOW_S = 2.0


def _path(name: str, root: Path) -> Path:
    return root / name.replace(".", "/")


def read(name: str, root: Path = PROC_SYS) -> str:
    """A sysctl's value as the kernel shows it, whitespace collapsed ('1024\\t65000' -> '1024 65000')."""
    try:
        return " ".join(_path(name, root).read_text().split())
    except OSError as exc:
        raise ArenaError(f"cannot read {name}: {exc.strerror}") from None


def write(name: str, value: str, root: Path = PROC_SYS) -> None:
    try:
        _path(name, root).write_text(value + "\n")
    except OSError as exc:
        raise ArenaError(f"cannot set {name} to {value}: {exc.strerror}") from None


def port_range(root: Path = PROC_SYS) -> tuple[int, int]:
    low, high = read(PORT_RANGE, root).split()
    return int(low), int(high)


def reuse_enabled(value: str) -> bool:
    """Whether tcp_tw_reuse lets connect() reuse TIME-WAIT ports for the arena's traffic:
    1 everywhere, 2 (Linux's default) on loopback only, which is where the arena runs."""
    return value.strip() in ("1", "2")


@dataclass
class Tuning:
    """The two settings before and during a run, and whether the arena changed them."""
    before: dict[str, str]
    during: dict[str, str]
    changed: list[str] = field(default_factory=list)
    note: str = ""
    root: Path = PROC_SYS

    def restore(self) -> None:
        """Put back every value this run changed (idempotent)."""
        for name in list(self.changed):
            write(name, self.before[name], self.root)
            self.changed.remove(name)

    def to_dict(self) -> dict:
        return {"before": self.before, "during": self.during,
                "changed": list(self.changed), "note": self.note}


def tune(root: Path = PROC_SYS, is_root: bool | None = None) -> Tuning:
    """Widen the client port range to at least WIDE_RANGE and enable tcp_tw_reuse (1) unless
    it already covers loopback, when this process may (root); otherwise leave them and say
    so. Never narrows what is set."""
    if is_root is None:
        is_root = os.geteuid() == 0
    before = {PORT_RANGE: read(PORT_RANGE, root), TW_REUSE: read(TW_REUSE, root)}
    low, high = port_range(root)
    wanted = {}
    if low > WIDE_RANGE[0] or high < WIDE_RANGE[1]:
        wanted[PORT_RANGE] = f"{min(low, WIDE_RANGE[0])} {max(high, WIDE_RANGE[1])}"
    if not reuse_enabled(before[TW_REUSE]):
        wanted[TW_REUSE] = "1"
    tuning = Tuning(before, dict(before), root=root)
    if not wanted:
        return tuning
    if not is_root:
        tuning.note = ("not root: left " + ", ".join(f"{n} = {before[n]}" for n in wanted) +
                       " (the arena would set " + ", ".join(f"{n} = {v}" for n, v in wanted.items()) + ")")
        return tuning
    try:
        for name, value in wanted.items():
            write(name, value, root)
            tuning.changed.append(name)
            tuning.during[name] = read(name, root)
    except ArenaError:
        tuning.restore()
        raise
    return tuning


# ss prints "local peer" address pairs; with a state filter there is no state column, and -o
# adds "timer:(timewait,59sec,0)".
_ADDR = re.compile(r"(\S+):(\d+)$")
_TIMER = re.compile(r"timer:\(timewait,(?:(\d+)min)?(?:(\d+)sec)?(?:(\d+)ms)?")


@dataclass(frozen=True)
class TimeWait:
    local_port: int
    peer_port: int
    remaining_s: float | None    # None when ss showed no timer


def parse_time_wait(text: str) -> list[TimeWait]:
    """The sockets of `ss -Htan -o state time-wait` output."""
    out = []
    for line in text.splitlines():
        addrs = [m for m in (_ADDR.match(tok) for tok in line.split()) if m]
        if len(addrs) < 2:
            continue
        timer = _TIMER.search(line)
        remaining = None
        if timer:
            minutes, seconds, millis = (int(g) if g else 0 for g in timer.groups())
            remaining = minutes * 60 + seconds + millis / 1000
        out.append(TimeWait(int(addrs[0].group(2)), int(addrs[1].group(2)), remaining))
    return out


def time_wait_sockets() -> list[TimeWait]:
    done = subprocess.run(["ss", "-Htan", "-o", "state", "time-wait"], capture_output=True, text=True,
                          timeout=30)
    return parse_time_wait(done.stdout)


def blocked_ports(sockets: list[TimeWait], port_range: tuple[int, int], dest_port: int, reuse: bool) -> int:
    """Client ports in `port_range` that a new connection to `dest_port` cannot use now:
    a TIME-WAIT socket blocks only its own destination (the kernel allows one port towards
    many destinations), and with reuse only for about a second after its last use."""
    low, high = port_range
    count = 0
    for s in sockets:
        if s.peer_port != dest_port or not low <= s.local_port <= high:
            continue
        if reuse and s.remaining_s is not None and s.remaining_s < TIME_WAIT_S - 1:
            continue
        count += 1
    return count


def ports_needed(rate: float, seconds: float, reuse: bool) -> int:
    """Client ports a point opening `rate` new connections per second for `seconds` needs:
    all of them without reuse (each stays in TIME-WAIT past the point's end), else those
    opened within the reuse window."""
    planned = math.ceil(rate * seconds)
    return min(planned, math.ceil(rate * REUSE_WINDOW_S)) if reuse else planned


@dataclass
class PortCheck:
    ok: bool
    waited_s: float
    free: dict[int, int]        # destination port -> free client ports at the end
    needed: int
    message: str = ""


def wait_for_ports(dest_ports: dict[int, str], needed: int, port_range: tuple[int, int], reuse: bool,
                   timeout: float = TIME_WAIT_S + 5, interval: float = 0.5,
                   sockets=time_wait_sockets) -> PortCheck:
    """Poll the TIME-WAIT sockets until every destination (port -> what it is, for the
    message) has `needed` free client ports, at most `timeout` seconds."""
    size = port_range[1] - port_range[0] + 1
    start = time.monotonic()
    while True:
        found = sockets()
        free = {port: size - blocked_ports(found, port_range, port, reuse) for port in dest_ports}
        short = {port: n for port, n in free.items() if n < needed}
        waited = time.monotonic() - start
        if not short:
            return PortCheck(True, waited, free, needed)
        if waited >= timeout:
            port, n = min(short.items(), key=lambda kv: kv[1])
            hint = ("" if reuse else f"; enable {TW_REUSE}") + (
                f"; widen {PORT_RANGE}" if size < WIDE_RANGE[1] - WIDE_RANGE[0] + 1 else "")
            return PortCheck(False, waited, free, needed,
                             f"not enough free client ports: the point needs {needed:,} towards "
                             f"{dest_ports[port]} (port {port}) but only {n:,} of the {size:,} in "
                             f"{PORT_RANGE} ({port_range[0]}-{port_range[1]}) were free after waiting "
                             f"{waited:.0f} s for TIME-WAIT sockets to expire{hint} (as root the arena "
                             "sets both)")
        time.sleep(interval)  # poll interval under the deadline
