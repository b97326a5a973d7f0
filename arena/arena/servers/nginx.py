"""nginx from Debian, run in the foreground with its own prefix, config, log and pid file."""

from __future__ import annotations

from pathlib import Path

from arena import procs
from arena.servers.base import Server, Site, TlsSite, run_user


def log_line(enabled: bool, rundir: Path) -> str:
    return f"access_log {rundir}/access.log combined;" if enabled else "access_log off;"


def tls_lines(tls: TlsSite | None, protocols: str | None = None, extra: str = "") -> str:
    """The server block's TLS directives (nginx syntax: nginx and gannet)."""
    if tls is None:
        return ""
    lines = [f"ssl_certificate {tls.cert};", f"ssl_certificate_key {tls.key};"]
    if protocols:
        lines.append(f"ssl_protocols {protocols};")
    if not tls.resumption:
        # Every new connection a full handshake: no tickets, no cache (nginx's default
        # `ssl_session_cache none` still lets a client offer a session ID; `off` does not).
        lines += ["ssl_session_tickets off;", "ssl_session_cache off;"]
    if extra:
        lines.append(extra)
    return "\n        ".join(lines)


class Nginx(Server):
    name = "nginx"
    title = "nginx"
    program = "nginx"
    package = "nginx"
    config_file = "nginx.conf"
    pid_file = "nginx.pid"
    no_http3 = "Debian's nginx 1.22 has no HTTP/3 (ngx_http_v3_module came with nginx 1.25)"

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
            # nginx 1.22 has no `http2 on` (1.25.1); HTTP/2 is a listen parameter.
            "listen_tls": (" ssl http2" if opts.tls.http2 else " ssl") if opts.tls else "",
            # 1.22's default protocols stop at TLSv1.2 (TLSv1.3 joined the default in 1.23.4).
            # Debian's nginx.conf (the default profile) lists TLSv1 to TLSv1.3 and prefers the
            # server's ciphers; the tuned profile offers what the other servers offer.
            "tls": tls_lines(opts.tls, "TLSv1.2 TLSv1.3" if tuned else "TLSv1 TLSv1.1 TLSv1.2 TLSv1.3",
                             "" if tuned else "ssl_prefer_server_ciphers on;"),
        }
        if tuned:
            values["worker_connections"] = max(1024, site.options.connections + 128)
            values["nofile"] = procs.nofile_limit()
        return values

    def command(self, binary: str, rundir: Path) -> list[str]:
        # -e: nginx opens its compiled-in error log before reading the config; keep it ours.
        return [binary, "-p", f"{rundir}/", "-e", str(rundir / "error.log"),
                "-c", str(rundir / self.config_file), "-g", "daemon off;"]
