"""Driving the idle-connection holder (arena/clients/idle.py) from the arena: start it
pinned to the client CPUs, wait for its "ready" report under a deadline, release it."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

from arena import procs


class IdleHolder:
    def __init__(self, host: str, port: int, path: str, connections: int, cpus: str,
                 open_seconds: float, hold_seconds: float, transport: str = "http",
                 cafile: str | None = None):
        cmd = [sys.executable, "-m", "arena.clients.idle", "--host", host, "--port", str(port),
               "--path", path, "--connections", str(connections),
               "--open-seconds", str(open_seconds), "--hold-seconds", str(hold_seconds),
               "--transport", transport] + (["--cafile", cafile] if cafile else [])
        self.proc = subprocess.Popen(procs.pinned(cmd, cpus), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.deadline = time.monotonic() + open_seconds + 30

    def _line(self, deadline: float) -> dict | None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line.strip() else None

    def wait_ready(self) -> dict:
        """{"served": n, "failed": m, "errors": {...}}; failed = all when it never reported."""
        report = self._line(self.deadline)
        return report or {"served": 0, "failed": None, "errors": {"holder gave no report": 1}}

    def release(self) -> int | None:
        """Close its stdin so it lets go; return how many connections were still open."""
        try:
            self.proc.stdin.close()
            report = self._line(time.monotonic() + 30)
            return report.get("still_open") if report else None
        finally:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
