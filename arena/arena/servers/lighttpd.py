"""lighttpd from Debian, in the foreground (-D) with its own config, log and pid file."""

from __future__ import annotations

from pathlib import Path

from arena import procs
from arena.servers.base import Server, Site, TlsSite, run_user

_ACCESS_FORMAT = r'%h %V %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-Agent}i\"'


def tls_settings(tls: TlsSite) -> str:
    """mod_openssl on the one socket; protocols and ciphers are lighttpd's defaults. HTTP/2 is
    the feature flag server.h2proto, on by default since 1.4.59 (the default profile, Debian's
    config, says so explicitly): ALPN offers h2 in both TLS variants, and a --tls run's clients
    ask only for HTTP/1.1."""
    lines = ['ssl.engine = "enable"', f'ssl.pemfile = "{tls.cert}"', f'ssl.privkey = "{tls.key}"']
    if not tls.resumption:
        # lighttpd keeps no session cache; its session tickets are turned off through OpenSSL.
        lines.append('ssl.openssl.ssl-conf-cmd = ("Options" => "-SessionTicket")')
    return "\n".join(lines)


class Lighttpd(Server):
    name = "lighttpd"
    no_http3 = "lighttpd 1.4 has no HTTP/3"
    title = "lighttpd"
    program = "lighttpd"
    package = "lighttpd"
    config_file = "lighttpd.conf"
    pid_file = "lighttpd.pid"

    def transport_files(self, transport: str) -> tuple[tuple[Path, str], ...]:
        if transport == "http":
            return ()
        return ((Path("/usr/lib/lighttpd/mod_openssl.so"), "lighttpd-mod-openssl"),)

    def version(self) -> str:
        return super().version().split(" - ")[0]

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        opts = site.options
        tuned = profile == "tuned"
        user = run_user()
        modules = []
        settings = []
        if opts.gzip:
            modules.append('"mod_deflate"')
            # min-compress-size as nginx's gzip_min_length default, so small files compress too.
            settings.append('deflate.mimetypes = ("text/")\n'
                            'deflate.allowed-encodings = ("gzip")\n'
                            'deflate.min-compress-size = 20')
        # Debian's packaged lighttpd.conf does not load mod_accesslog.
        if opts.tls:
            modules.append('"mod_openssl"')
            settings.append(tls_settings(opts.tls))
        if opts.access_log if opts.access_log is not None else False:
            modules.append('"mod_accesslog"')
            settings.append(f'accesslog.filename = "{rundir}/access.log"\n'
                            f'accesslog.format = "{_ACCESS_FORMAT}"')
        values = {
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "docroot": site.docroot,
            "user": f'server.username = "{user[0]}"\nserver.groupname = "{user[1]}"' if user else "",
            "modules": "".join(f",\n    {m}" for m in modules),
            "settings": "\n".join(settings),
        }
        if opts.keepalive_timeout is not None or tuned:
            values["keepalive"] = f"server.max-keep-alive-idle = {opts.keepalive_timeout or 65}"
        else:
            values["keepalive"] = ""
        if tuned:
            values["max_fds"] = procs.nofile_limit()
            values["max_connections"] = max(1024, opts.connections + 128)
        return values

    def command(self, binary: str, rundir: Path) -> list[str]:
        return [binary, "-D", "-f", str(rundir / self.config_file)]
