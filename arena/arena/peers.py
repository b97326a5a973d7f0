"""`arena peers install`: apt-get install the peer servers and load tools (idempotent: apt
skips what is already installed), and `arena servers`: what is installed, with versions."""

from __future__ import annotations

import os
import shutil
import subprocess

from arena.errors import ArenaError
from arena.tools import LOAD_TOOLS, PEER_PACKAGES, tool_version


def install(dry_run: bool = False) -> list[str]:
    """The apt-get command for every peer package; run it unless `dry_run`."""
    if shutil.which("apt-get") is None:
        raise ArenaError("apt-get not found: `arena peers install` needs a Debian or Ubuntu system")
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    if sudo and shutil.which("sudo") is None:
        raise ArenaError("installing packages needs root: run `arena peers install` as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    commands = [sudo + ["apt-get", "update", "-q"],
                sudo + ["apt-get", "install", "-y", "-q", "--no-install-recommends"] + PEER_PACKAGES]
    if not dry_run:
        for cmd in commands:
            done = subprocess.run(cmd, env=env)
            if done.returncode != 0:
                raise ArenaError(f"`{' '.join(cmd)}` failed with exit code {done.returncode}")
        # Debian starts the packaged services on install; the arena never uses them and
        # they hold port 80, so stop them (ignore failures: there may be no init system).
        for service in ("nginx", "apache2", "lighttpd", "h2o", "caddy", "varnish", "haproxy"):
            subprocess.run(sudo + ["service", service, "stop"], capture_output=True, env=env)
    return [" ".join(c) for c in commands]


def inventory(servers) -> list[tuple[str, str, str]]:
    """(name, kind, version or 'missing') for every server adapter and load tool."""
    rows = [(s.name, "server", s.version()) for s in servers]
    rows += [(t, "load tool", tool_version(t)) for t in LOAD_TOOLS]
    return rows
