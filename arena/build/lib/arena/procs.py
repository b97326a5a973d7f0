"""Process helpers: launching pinned commands, walking a process tree, stopping by pid."""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path

from arena.tools import require


def pinned(cmd: list[str], cpus: str) -> list[str]:
    """`cmd` run through taskset on the given CPU list (e.g. "0" or "0,1")."""
    return [require("taskset"), "-c", cpus] + cmd


def raise_nofile_limit() -> None:
    """Raise this process's open-files soft limit to its hard limit.

    Used as a preexec_fn for servers and in the idle-connection client: c10k needs more than
    the usual 1,024 descriptors, and the hard limit here is 20,000 per process.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def nofile_limit() -> int:
    """The hard open-files limit that servers will get."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


def _ppid_map() -> dict[int, int]:
    """pid -> parent pid for every process visible in /proc."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def process_tree(root: int) -> list[int]:
    """`root` and all its live descendants (root first)."""
    parents = _ppid_map()
    if root not in parents:
        return []
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_gone(pids: list[int], deadline: float, reap=None) -> bool:
    """Poll until none of `pids` is alive or `deadline` (monotonic) passes."""
    while True:
        if reap is not None:
            reap()
        if not any(alive(pid) for pid in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)  # polling interval of a deadline-bounded wait, not synchronisation


def stop_tree(root: int, grace: float = 5.0, reap=None) -> None:
    """Stop `root` and its descendants: SIGTERM to the root, then SIGKILL to whatever remains.

    The tree is captured before signalling so that workers orphaned by the master's exit are
    still found and killed. `reap` is called while waiting so our own child does not linger
    as a zombie.
    """
    tree = process_tree(root)
    if not tree:
        if reap is not None:
            reap()
        return
    _signal_all([root], signal.SIGTERM)
    if wait_gone(tree, time.monotonic() + grace, reap):
        return
    _signal_all(tree, signal.SIGKILL)
    wait_gone(tree, time.monotonic() + grace, reap)
