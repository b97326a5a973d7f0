"""Sampling a server's process tree from /proc: CPU seconds (and their part in the kernel),
peak CPU %, peak RSS and PSS.

CPU of a tree = sum over its live processes of utime+stime plus cutime+cstime: a child that
exits and is reaped (Apache prefork recycling a process) adds its times to its parent's
cutime/cstime, so nothing is lost and nothing counted twice.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from arena.procs import process_tree

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds of one process and its reaped children (0 if it is gone).

    /proc/PID/stat counts in clock ticks (10 ms) and truncates per process: a PHP-FPM child
    that served three requests in 4 ms reads 0, so a pool of 100 such children can show no CPU
    at all over a short run. The threads' /proc/PID/task/TID/schedstat count nanoseconds but
    forget threads that already exited. Both are lower bounds of the truth, so the larger one
    is taken; reaped children (stat's cutime+cstime) are only known in ticks.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5): utime=14, stime=15, cutime=16, cstime=17.
    own_ticks = (int(fields[11]) + int(fields[12])) / TICKS
    reaped = (int(fields[13]) + int(fields[14])) / TICKS
    return max(own_ticks, threads_runtime_seconds(pid)) + reaped


def threads_runtime_seconds(pid: int) -> float:
    """Sum of the live threads' run time in nanoseconds-precise seconds (0 if unreadable)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def tree_cpu_seconds(pids: list[int]) -> float:
    return sum(process_cpu_seconds(pid) for pid in pids)


def process_kernel_seconds(pid: int) -> float:
    """The part of a process's CPU seconds (and its reaped children's) spent in the kernel:
    stat's stime + cstime, in ticks (0 if it is gone). For a server this is the system calls
    and the network stack's work done on its behalf - the part no user-space change removes,
    so it bounds what a faster server can gain over another (docs/bench/README.md)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[12]) + int(fields[14])) / TICKS


def tree_kernel_seconds(pids: list[int]) -> float:
    return sum(process_kernel_seconds(pid) for pid in pids)


def rss_kib(pid: int) -> int:
    """Resident set size of one process in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid: int) -> int:
    """Proportional set size of one process in KiB: shared pages split among their users."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class MemorySnapshot:
    rss_kib: int
    pss_kib: int
    processes: int


def tree_memory(root: int) -> MemorySnapshot:
    """RSS (summed, so shared pages count once per process) and PSS of the whole tree."""
    pids = process_tree(root)
    return MemorySnapshot(sum(rss_kib(p) for p in pids), sum(pss_kib(p) for p in pids), len(pids))


@dataclass
class TreeSample:
    """What a Sampler saw over one load run."""
    cpu_seconds: float = 0.0
    kernel_seconds: float = 0.0
    peak_cpu_percent: float = 0.0
    peak_rss_kib: int = 0
    peak_pss_kib: int = 0
    peak_processes: int = 0
    samples: int = 0
    wall_seconds: float = 0.0


@dataclass
class Sampler:
    """Samples a process tree in a background thread while a load run goes on.

    CPU time is read at start and stop (exact); peaks are read every `interval` seconds.
    PSS is costlier to read (smaps_rollup walks page tables), so it is read every
    `pss_every`-th sample. `pids`, if given, chooses the processes instead of the whole tree
    under `root` (e.g. one PHP-FPM pool out of a master's several).
    """
    root: int
    interval: float = 0.1
    pss_every: int = 3
    result: TreeSample = field(default_factory=TreeSample)
    pids: Callable[[], list[int]] | None = None

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _pids(self) -> list[int]:
        return self.pids() if self.pids is not None else process_tree(self.root)

    def _sample(self, count: int, last: tuple[float, float] | None) -> tuple[float, float]:
        pids = self._pids()
        now = time.monotonic()
        cpu = tree_cpu_seconds(pids)
        res = self.result
        res.peak_processes = max(res.peak_processes, len(pids))
        res.peak_rss_kib = max(res.peak_rss_kib, sum(rss_kib(p) for p in pids))
        if count % self.pss_every == 0:
            res.peak_pss_kib = max(res.peak_pss_kib, sum(pss_kib(p) for p in pids))
        if last is not None and now > last[0]:
            # A process that exits between two samples takes its unreaped CPU with it, which
            # could make the delta negative: clamp.
            percent = max(0.0, (cpu - last[1]) / (now - last[0]) * 100)
            res.peak_cpu_percent = max(res.peak_cpu_percent, percent)
        res.samples += 1
        return now, cpu

    def _loop(self):
        count, last = 0, self._first
        while not self._stop.wait(self.interval):
            count += 1
            last = self._sample(count, last)

    def start(self) -> "Sampler":
        self._start_wall = time.monotonic()
        pids = self._pids()
        self._start_cpu = tree_cpu_seconds(pids)
        self._start_kernel = tree_kernel_seconds(pids)
        self._first = self._sample(0, None)
        self._thread.start()
        return self

    def stop(self) -> TreeSample:
        self._stop.set()
        self._thread.join()
        pids = self._pids()
        self.result.cpu_seconds = max(0.0, tree_cpu_seconds(pids) - self._start_cpu)
        self.result.kernel_seconds = max(0.0, tree_kernel_seconds(pids) - self._start_kernel)
        self.result.peak_pss_kib = max(self.result.peak_pss_kib, sum(pss_kib(p) for p in pids))
        self.result.wall_seconds = time.monotonic() - self._start_wall
        return self.result
