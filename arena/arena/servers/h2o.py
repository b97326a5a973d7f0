"""h2o from Debian, in worker mode (foreground) with its own YAML config, log and pid file."""

from __future__ import annotations

from pathlib import Path

from arena.servers.base import Server, Site, run_user


class H2o(Server):
    name = "h2o"
    title = "h2o"
    program = "h2o"
    package = "h2o"
    config_file = "h2o.conf"
    pid_file = "h2o.pid"

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        opts = site.options
        tuned = profile == "tuned"
        user = run_user()
        access = opts.access_log if opts.access_log is not None else not tuned
        values = {
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "docroot": site.docroot,
            # Debian's h2o.conf runs as debian-h2o; any unprivileged user serves our files.
            "user": f"user: {user[0]}" if user else "",
            "access_log": f"access-log: {rundir}/access.log" if access else "",
            "gzip": "compress: ON" if opts.gzip else "",
            "keepalive": (f"http1-request-timeout: {opts.keepalive_timeout}"
                          if opts.keepalive_timeout is not None else ""),
        }
        if tuned:
            values["max_connections"] = max(1024, opts.connections + 128)
        return values

    def command(self, binary: str, rundir: Path) -> list[str]:
        return [binary, "-m", "worker", "-c", str(rundir / self.config_file)]
