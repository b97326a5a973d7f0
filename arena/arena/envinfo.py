"""The environment record of a run: machine, kernel, versions of every server and tool, the
exact command line, and (written beside it) the exact configs each server ran with."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from arena import __version__, tools
from arena.servers.gannet import REPO_ROOT, gannet_binary, mime_types


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_total_mib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def collect(servers, tool_names: list[str], options) -> dict:
    """Everything needed to repeat the run, as plain JSON-able data."""
    gannet = gannet_binary()
    return {
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        # As typed: `arena ...`, also when run as `python3 -m arena` (argv[0] is then the
        # package's __main__.py path, which nobody types).
        "command": ["arena", *sys.argv[1:]],
        "arena_version": __version__,
        "python": sys.version.split()[0],
        "kernel": platform.release(),
        "os": platform.platform(),
        "cpu_model": cpu_model(),
        "cpus_online": os.cpu_count(),
        "memory_mib": memory_total_mib(),
        "open_files_limit": tools.command_output(["sh", "-c", "ulimit -Hn"]).strip(),
        "pinning": {"server_cpus": options.server_cpus, "client_cpus": options.client_cpus},
        "profile": options.profile,
        "repository_commit": git_commit(),
        "gannet_binary": str(gannet),
        # What identifies the build measured (its version line does not): a resumed run
        # (arena/resume.py) must measure the same one.
        "gannet_sha256": sha256(gannet),
        "gannet_mime_types": str(mime_types()),
        "servers": {s.name: s.version() for s in servers},
        "tools": {name: tools.tool_version(name) for name in tool_names},
    }


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # no gannet built: only a run without it gets this far


def write_configs(folder: Path, running) -> None:
    """configs/<server>/<file>: the exact rendered configs, plus the command line used."""
    for server in running:
        target = folder / "configs" / server.name
        target.mkdir(parents=True, exist_ok=True)
        for name, text in server.configs.items():
            (target / name).write_text(text)
        (target / "command.txt").write_text(" ".join(server.command) + "\n")
