"""`--server-quota P`: every server's whole process tree in its own cgroup limited to P % of one
CPU, so that the server, not the load tool, sets the request rate and req/s becomes capacity per
core (BENCHMARKING.md). On a 2-core machine wrk spends its whole core before the fastest servers
spend theirs; under a small quota the client has room to spare and the ranking is the servers'.

A server is started inside its group (the child joins it before it execs, so its workers and
threads are born there); only the server under test is limited, never a scenario's back ends or
the PHP tier. cgroup v1 (`cpu` controller: cpu.cfs_quota_us / cpu.cfs_period_us) and v2
(`cpu.max`) are both handled. Each round reads the group's throttle count: a round the quota
never throttled did not make the server the limit, and the report says so.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from arena.errors import ArenaError

ROOT = Path("/sys/fs/cgroup")
# 10 ms periods: a short period spreads the quota finely, as the measurements did.
PERIOD_US = 10_000


def _v1_root(root: Path) -> Path | None:
    cpu = root / "cpu"
    return cpu if (cpu / "cpu.cfs_quota_us").exists() else None


def _v2_root(root: Path) -> Path | None:
    for candidate in (root, root / "unified"):
        controllers = candidate / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return candidate
    return None


class CpuQuota:
    """One server's cgroup with `percent` % of one CPU."""

    def __init__(self, name: str, percent: float, root: Path = ROOT):
        if not 1 <= percent <= 100:
            raise ArenaError(f"--server-quota must be between 1 and 100 (% of one CPU), not {percent:g}")
        self.percent = percent
        quota = round(PERIOD_US * percent / 100)
        group = f"arena-{name}-{os.getpid()}"
        v1 = _v1_root(root)
        try:
            if v1:
                self.version = "cgroup v1 cpu"
                self.path = v1 / group
                self.path.mkdir(exist_ok=True)
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                v2 = _v2_root(root)
                if v2 is None:
                    raise ArenaError("--server-quota needs the cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 "
                                     "cpu.max); none is mounted here")
                self.version = "cgroup v2 cpu.max"
                # The cpu controller must be enabled for the parent's children.
                subtree = v2 / "cgroup.subtree_control"
                if "cpu" not in subtree.read_text().split():
                    subtree.write_text("+cpu")
                self.path = v2 / group
                self.path.mkdir(exist_ok=True)
                (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        except PermissionError:
            raise ArenaError("--server-quota writes cgroups: run the arena as root") from None
        except OSError as exc:
            raise ArenaError(f"cannot make the CPU quota's cgroup: {exc}") from None

    def enter(self) -> None:
        """Move the calling process into the group (a server's preexec_fn: before it execs)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def throttled(self) -> int:
        """How many periods the group has been throttled in so far."""
        found = re.search(r"^nr_throttled (\d+)", (self.path / "cpu.stat").read_text(), re.MULTILINE)
        return int(found.group(1)) if found else 0

    def close(self) -> None:
        """Remove the group once its processes are gone (a stopped server's)."""
        try:
            self.path.rmdir()
        except OSError:
            pass  # still in use or already gone: nothing the run can do about it

    def to_dict(self) -> dict:
        return {"percent": self.percent, "period_us": PERIOD_US, "cgroup": self.version}
