"""HAProxy from Debian: the proxy people pick when nginx's proxying is not enough. It serves the
l4-proxy scenario's site (`mode tcp`), in the foreground (`-db`) with its own config and pid
file."""

from __future__ import annotations

from pathlib import Path

from arena import procs
from arena.servers.base import Server, Site, run_user


class Haproxy(Server):
    name = "haproxy"
    no_http3 = "Debian's HAProxy is built without QUIC (`haproxy -vv` lists -QUIC)"
    title = "HAProxy"
    program = "haproxy"
    package = "haproxy"
    config_file = "haproxy.cfg"
    pid_file = "haproxy.pid"

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        user = run_user()
        return {
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "user": f"user {user[0]}\n    group {user[1]}" if user else "",
            # Connections of both sides fit in the descriptors the arena gives every server.
            "maxconn": min(procs.nofile_limit() // 2 - 64, max(1024, 2 * site.options.connections)),
        }

    def command(self, binary: str, rundir: Path) -> list[str]:
        return [binary, "-db", "-f", str(rundir / self.config_file)]
