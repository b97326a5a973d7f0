"""Caddy from Debian: a Caddyfile, `caddy run`, admin API off, state kept in the run directory.
The tuned profile sets GOMAXPROCS=1 so Go schedules on one worker thread, like the others.

TLS (--tls, --h2, --h3) uses the run's certificate files (`tls CERT KEY`; no ACME, no redirect
listener). The Caddyfile has no switch for session tickets, so a run without resumption adapts
the Caddyfile to JSON (`caddy adapt`), sets `apps.tls.session_tickets.disabled`, and runs that."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from arena.errors import ArenaError
from arena.servers.base import Server, Site, TlsSite

JSON_CONFIG = "caddy.json"


def servers_block(keepalive: int | None, protocols: str | None) -> str:
    """The global `servers` options: the idle timeout, and the protocols served over TLS (h3
    only in the --h3 variant: elsewhere it would open a UDP port no client uses)."""
    inner = []
    if keepalive is not None:
        inner.append(f"timeouts {{\n\t\t\tidle {keepalive}s\n\t\t}}")
    if protocols:
        inner.append(f"protocols {protocols}")
    if not inner:
        return ""
    return "servers {\n" + "".join(f"\t\t{line}\n" for line in inner) + "\t}"


def protocols(tls: TlsSite | None) -> str | None:
    """What Caddy serves over TLS: HTTP/1.1, with h2 (--h2) or h3 on UDP (--h3)."""
    if tls is None:
        return None
    return "h1 h3" if tls.http3 else "h1 h2" if tls.http2 else "h1"


class Caddy(Server):
    name = "caddy"
    title = "Caddy"
    program = "caddy"
    package = "caddy"
    config_file = "Caddyfile"
    pid_file = "caddy.pid"
    no_http3 = None

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
        values = {
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "docroot": site.docroot,
            "gzip": "encode gzip" if opts.gzip else "",
            "access_log": f"log {{\n\t\toutput file {rundir}/access.log\n\t}}" if access else "",
            "servers": servers_block(keepalive, protocols(opts.tls)),
            "scheme": site.scheme,
            "tls": f"tls {opts.tls.cert} {opts.tls.key}" if opts.tls else "",
        }
        if not tuned:
            # The tuned profile turns automatic HTTPS off; the default profile keeps it but without
            # its HTTP-to-HTTPS redirect listener, which would take port 80.
            values["auto_https"] = "auto_https disable_redirects" if opts.tls else ""
        return values

    def configs(self, site: Site, rundir: Path, profile: str) -> dict[str, str]:
        configs = super().configs(site, rundir, profile)
        if site.options.tls and not site.options.tls.resumption:
            configs[JSON_CONFIG] = without_session_tickets(self.binary(), configs[self.config_file], rundir)
        return configs

    def command(self, binary: str, rundir: Path) -> list[str]:
        # The JSON config is written only when the Caddyfile cannot say everything (above).
        if (rundir / JSON_CONFIG).exists():
            config = ["--config", str(rundir / JSON_CONFIG)]
        else:
            config = ["--config", str(rundir / self.config_file), "--adapter", "caddyfile"]
        return [binary, "run", *config, "--pidfile", str(rundir / self.pid_file)]

    def environment(self, rundir: Path, profile: str) -> dict[str, str]:
        env = {"HOME": str(rundir), "XDG_DATA_HOME": str(rundir / "data"),
               "XDG_CONFIG_HOME": str(rundir / "config")}
        if profile == "tuned":
            env["GOMAXPROCS"] = "1"
        return env


def without_session_tickets(binary: str, caddyfile: str, rundir: Path) -> str:
    """The Caddyfile adapted to JSON by Caddy itself, with session tickets disabled."""
    rundir.mkdir(parents=True, exist_ok=True)
    source = rundir / "Caddyfile.adapt"
    source.write_text(caddyfile)
    try:
        done = subprocess.run([binary, "adapt", "--config", str(source), "--adapter", "caddyfile"],
                              capture_output=True, text=True, timeout=30,
                              env={"HOME": str(rundir), "PATH": "/usr/bin:/bin"})
    finally:
        source.unlink(missing_ok=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ArenaError(f"caddy adapt failed on the arena's Caddyfile: {last}")
    config = json.loads(done.stdout)
    config.setdefault("apps", {}).setdefault("tls", {})["session_tickets"] = {"disabled": True}
    return json.dumps(config, indent=2) + "\n"
