"""nginx from Debian, run in the foreground with its own prefix, config, log and pid file."""

from __future__ import annotations

from pathlib import Path

from arena import procs
from arena.servers.base import Server, Site, run_user


def log_line(enabled: bool, rundir: Path) -> str:
    return f"access_log {rundir}/access.log combined;" if enabled else "access_log off;"


class Nginx(Server):
    name = "nginx"
    title = "nginx"
    program = "nginx"
    package = "nginx"
    config_file = "nginx.conf"
    pid_file = "nginx.pid"

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        opts = site.options
        user = run_user()
        tuned = profile == "tuned"
        gzip = opts.gzip if opts.gzip is not None else not tuned  # Debian's nginx.conf has gzip on
        access = opts.access_log if opts.access_log is not None else not tuned
        values = {
            "user": f"user {user[0]} {user[1]};" if user else "",
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "docroot": site.docroot,
            "access_log": log_line(access, rundir),
            "gzip": "gzip on;\n    gzip_types text/plain text/css application/javascript;" if gzip else "gzip off;",
            "keepalive_timeout": opts.keepalive_timeout if opts.keepalive_timeout is not None else 65,
        }
        if tuned:
            values["worker_connections"] = max(1024, site.options.connections + 128)
            values["nofile"] = procs.nofile_limit()
        return values

    def command(self, binary: str, rundir: Path) -> list[str]:
        # -e: nginx opens its compiled-in error log before reading the config; keep it ours.
        return [binary, "-p", f"{rundir}/", "-e", str(rundir / "error.log"),
                "-c", str(rundir / self.config_file), "-g", "daemon off;"]
