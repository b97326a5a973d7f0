"""h2o from Debian, in worker mode (foreground) with its own YAML config, log and pid file."""

from __future__ import annotations

from pathlib import Path

from arena.servers.base import Server, Site, TlsSite, run_user


def keepalive(timeout: int | None, tls: bool) -> str:
    """How long an idle connection is kept: HTTP/1 and, over TLS, HTTP/2 (h2o's own idle timeout
    for HTTP/2 is 10 s, which would close c10k's idle connections)."""
    if timeout is None:
        return ""
    lines = [f"http1-request-timeout: {timeout}"]
    if tls:
        lines.append(f"http2-idle-timeout: {timeout}")
    return "\n".join(lines)


def listen_tls(tls: TlsSite | None) -> str:
    """The listen block's ssl map. h2o offers h2 in ALPN whenever it speaks TLS (it has no switch
    for it); a --tls run's clients ask only for HTTP/1.1. Protocols and ciphers: h2o's defaults."""
    if tls is None:
        return ""
    return f"ssl:\n    certificate-file: {tls.cert}\n    key-file: {tls.key}"


class H2o(Server):
    name = "h2o"
    title = "h2o"
    program = "h2o"
    package = "h2o"
    config_file = "h2o.conf"
    pid_file = "h2o.pid"
    no_http3 = "Debian's h2o 2.2 has no HTTP/3 (QUIC came with h2o 2.3)"

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
            "keepalive": keepalive(opts.keepalive_timeout, opts.tls is not None),
            "listen_tls": listen_tls(opts.tls),
            # h2o resumes sessions by default (its internal cache and tickets).
            "tls": "ssl-session-resumption:\n  mode: off" if opts.tls and not opts.tls.resumption else "",
        }
        if tuned:
            values["max_connections"] = max(1024, opts.connections + 128)
        return values

    def command(self, binary: str, rundir: Path) -> list[str]:
        return [binary, "-m", "worker", "-c", str(rundir / self.config_file)]
