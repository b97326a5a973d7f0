"""Varnish Cache from Debian: the dedicated HTTP cache people put in front of nginx. It serves
only the cache scenario's site (a VCL in front of the origin); `varnishd -F` in the foreground
with its own working folder, the listen address on its command line."""

from __future__ import annotations

from pathlib import Path

from arena.servers.base import Server, Site


class Varnish(Server):
    name = "varnish"
    no_http3 = "Varnish has no HTTP/3 (nor TLS)"
    title = "Varnish"
    program = "varnishd"
    package = "varnish"
    config_file = "varnish.vcl"
    pid_file = "varnish.pid"

    version_flag = "-V"

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        # The VCL names only the origin (the site's own values); the rest is on the command line.
        return {}

    def command(self, binary: str, rundir: Path) -> list[str]:
        raise NotImplementedError("varnishd takes its listen address on the command line: site_command()")

    def site_command(self, binary: str, rundir: Path, site: Site, profile: str) -> list[str]:
        cmd = [binary, "-F", "-a", f"{site.host}:{site.port}", "-f", str(rundir / self.config_file),
               "-n", str(rundir / "varnishd"), "-P", str(rundir / self.pid_file), "-T", "none",
               "-s", "malloc,1g"]
        if profile == "tuned":
            # One thread pool (the others run one worker); threads made ahead for c=1,000.
            cmd += ["-p", "thread_pools=1", "-p", f"thread_pool_min={min(1000, site.options.connections)}"]
        return cmd
