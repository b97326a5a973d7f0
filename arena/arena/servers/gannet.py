"""gannet, built from this repository: nginx-syntax config, `gannet -c FILE -p PREFIX`,
foreground, writes its pid file. Its template sticks to the directives gannet implements."""

from __future__ import annotations

import os
from pathlib import Path

from arena import repo
from arena.errors import ArenaError
from arena.servers.base import Server, Site, TlsSite
from arena.servers.nginx import log_line, tls_lines
from arena.tools import command_output

REPO_ROOT = repo.root_or_nowhere()


def gannet_binary() -> Path:
    override = os.environ.get("GANNET_BIN")
    return Path(override) if override else REPO_ROOT / "target" / "release" / "gannet"


def mime_types() -> Path:
    """The repository's conf/mime.types; Debian nginx's copy until the repository has one."""
    ours = REPO_ROOT / "conf" / "mime.types"
    return ours if ours.exists() else Path("/etc/nginx/mime.types")


def protocol_lines(tls: TlsSite | None, site: Site, tuned: bool) -> str:
    """`http2 on` (--h2), or QUIC on the same port number beside the TCP listener (--h3, as
    nginx's documentation sets it up); the tuned profile sends with UDP segmentation offload,
    as Caddy (quic-go) does by default."""
    if tls is None:
        return ""
    if tls.http3:
        return f"listen {site.host}:{site.port} quic;" + ("\n        quic_gso on;" if tuned else "")
    return "http2 on;" if tls.http2 else ""


class Gannet(Server):
    name = "gannet"
    title = "gannet"
    program = "gannet"
    package = "(built from this repository)"
    config_file = "gannet.conf"
    pid_file = "gannet.pid"
    no_http3 = None

    def binary(self) -> str:
        path = gannet_binary()
        if not os.environ.get("GANNET_BIN") and repo.find() is None:
            raise ArenaError("gannet binary not found: no gannet checkout here (run the arena from one, "
                             f"pass --repo PATH or set {repo.ENV}, or set GANNET_BIN to the binary)")
        if not path.is_file() or not os.access(path, os.X_OK):
            source = "GANNET_BIN" if os.environ.get("GANNET_BIN") else "the default location"
            raise ArenaError(
                f"gannet binary not found at {path} ({source}): build it with "
                f"`cargo build --release` in {REPO_ROOT}, or set GANNET_BIN"
            )
        return str(path)

    def version(self) -> str:
        if not self.available():
            return "missing"
        out = command_output([self.binary(), "-v"]).strip()
        return out.splitlines()[0] if out else f"built {self.binary()}"

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        opts = site.options
        tuned = profile == "tuned"
        access = opts.access_log if opts.access_log is not None else not tuned
        values = {
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "docroot": site.docroot,
            # mime.types and fastcgi_params (PHP sites) come from the same folder.
            "conf_dir": mime_types().parent,
            "access_log": log_line(access, rundir),
            # The same types as the nginx adapter: text/html alone would leave robots.txt plain.
            "gzip": ("gzip on;\n    gzip_types text/plain text/css application/javascript;"
                     if opts.gzip else "gzip off;"),
            "keepalive_timeout": opts.keepalive_timeout if opts.keepalive_timeout is not None else 65,
            "listen_tls": " ssl" if opts.tls else "",
            # gannet's defaults: TLSv1.2 and TLSv1.3, its own cipher order.
            "tls": tls_lines(opts.tls, extra=protocol_lines(opts.tls, site, tuned)),
        }
        if tuned:
            values["worker_connections"] = max(1024, site.options.connections + 128)
        return values

    def command(self, binary: str, rundir: Path) -> list[str]:
        return [binary, "-c", str(rundir / self.config_file), "-p", f"{rundir}/"]
