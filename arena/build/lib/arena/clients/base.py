"""What every load-tool client shares: the result record, unit parsing, and running a tool
pinned to the client CPUs with a hard deadline while measuring its own CPU use."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from arena import procs


@dataclass
class LoadResult:
    """One load run as the client saw it. Latencies in milliseconds; None = not reported."""
    tool: str
    requests: int = 0               # completed responses
    failures: int = 0               # socket errors + non-2xx/3xx responses
    socket_errors: int = 0
    non_2xx_3xx: int = 0
    duration_s: float = 0.0
    rps: float = 0.0
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # p50 p90 p99 max mean
    bytes_total: int | None = None  # bytes received, headers included
    body_bytes: int | None = None
    header_bytes: int | None = None
    sent: int | None = None         # requests sent (wrk: completed + abandoned when it stopped)
    extra: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ToolRun:
    """A finished tool process: its output and what it cost on the client CPU."""
    stdout: str
    stderr: str
    returncode: int
    cpu_seconds: float
    wall_seconds: float
    timed_out: bool
    # Stopped by SIGINT at its deadline and exited by itself: its output holds its counts so far.
    interrupted: bool = False

    @property
    def cpu_percent(self) -> float:
        return 100.0 * self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


_TIME_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_SIZE_UNITS = {"B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "TB": 1024 ** 4}


def to_ms(value: str, unit: str) -> float:
    """'1.49', 'ms' -> 1.49; '596.10', 'us' -> 0.5961."""
    return float(value) * _TIME_UNITS[unit]


def to_bytes(value: str, unit: str) -> int:
    return int(float(value) * _SIZE_UNITS[unit])


def number(pattern: str, text: str, cast=float, default=None):
    """First capture group of `pattern` in `text`, cast; `default` if absent."""
    match = re.search(pattern, text, re.MULTILINE)
    return cast(match.group(1)) if match else default


def run_tool(cmd: list[str], cpus: str, timeout: float, tick=None, tick_interval: float = 0.05,
             interrupt_grace: float | None = None) -> ToolRun:
    """Run `cmd` pinned to `cpus`; kill it if it outlives `timeout` seconds.

    With `interrupt_grace`, a tool still running at the deadline first gets SIGINT (httperf
    then stops and prints its statistics so far) and is killed only if it has not exited
    `interrupt_grace` seconds later.
    Output goes to files, not pipes, so a chatty tool never blocks on a full pipe.
    `tick()` is called while waiting (progress display). Ctrl-C kills the tool and propagates.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(procs.pinned(cmd, cpus), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
        timed_out = interrupted = False
        kill_at = None
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                now = time.monotonic()
                if not timed_out and now - start > timeout:
                    timed_out = True
                    if interrupt_grace is not None:
                        interrupted = True
                        os.killpg(proc.pid, signal.SIGINT)
                        kill_at = now + interrupt_grace
                if timed_out and (kill_at is None or now > kill_at):
                    interrupted = False  # it did not stop on SIGINT: nothing it printed counts
                    os.killpg(proc.pid, signal.SIGKILL)
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                if tick is not None:
                    tick()
                time.sleep(tick_interval)  # poll interval under the deadline
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            raise
        finally:
            proc.returncode = 0  # reaped by wait4 above; stop Popen from waiting again
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return ToolRun(
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            returncode=os.waitstatus_to_exitcode(status),
            cpu_seconds=usage.ru_utime + usage.ru_stime,
            wall_seconds=wall,
            timed_out=timed_out,
            interrupted=interrupted,
        )


def tool_failed(run: ToolRun, tool: str) -> str | None:
    """A one-line reason when the tool itself failed (as opposed to the server)."""
    if run.timed_out and run.interrupted:
        return (f"{tool} stalled: still running at its deadline, stopped with SIGINT after {run.wall_seconds:.0f} s; "
                "what it counted until then is kept")
    if run.timed_out:
        return f"{tool} did not finish within its deadline and was killed"
    if run.returncode != 0:
        last = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:] or ["no output"]
        return f"{tool} exited with code {run.returncode}: {last[0]}"
    return None


def script_path(name: str) -> Path:
    return Path(__file__).with_name(name)
