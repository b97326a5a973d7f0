"""Caddy from Debian: a Caddyfile, `caddy run`, admin API off, state kept in the run directory.
The tuned profile sets GOMAXPROCS=1 so Go schedules on one worker thread, like the others."""

from __future__ import annotations

from pathlib import Path

from arena.servers.base import Server, Site


class Caddy(Server):
    name = "caddy"
    title = "Caddy"
    program = "caddy"
    package = "caddy"
    config_file = "Caddyfile"
    pid_file = "caddy.pid"

    def version(self) -> str:
        if not self.available():
            return "missing"
        from arena.tools import command_output
        return "caddy " + command_output([self.binary(), "version"]).strip().split(" ")[0]

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        opts = site.options
        tuned = profile == "tuned"
        access = opts.access_log if opts.access_log is not None else False
        keepalive = opts.keepalive_timeout if opts.keepalive_timeout is not None else (65 if tuned else None)
        return {
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "docroot": site.docroot,
            "gzip": "encode gzip" if opts.gzip else "",
            "access_log": f"log {{\n\t\toutput file {rundir}/access.log\n\t}}" if access else "",
            "servers": (f"servers {{\n\t\ttimeouts {{\n\t\t\tidle {keepalive}s\n\t\t}}\n\t}}"
                        if keepalive is not None else ""),
        }

    def command(self, binary: str, rundir: Path) -> list[str]:
        return [binary, "run", "--config", str(rundir / self.config_file), "--adapter", "caddyfile",
                "--pidfile", str(rundir / self.pid_file)]

    def environment(self, rundir: Path, profile: str) -> dict[str, str]:
        env = {"HOME": str(rundir), "XDG_DATA_HOME": str(rundir / "data"),
               "XDG_CONFIG_HOME": str(rundir / "config")}
        if profile == "tuned":
            env["GOMAXPROCS"] = "1"
        return env
