"""Apache httpd 2.4 from Debian with a real MPM (prefork, worker or event), from a
self-contained config: `apache2 -f FILE -DFOREGROUND`, modules loaded from
/usr/lib/apache2/modules, nothing read from /etc/apache2."""

from __future__ import annotations

import math
from pathlib import Path

from arena.servers.base import Server, Site, TlsSite, run_user
from arena.servers.sites import APACHE_MODULES

MODULES = APACHE_MODULES
MPMS = ("prefork", "worker", "event")

# Debian's mods-available/mpm_*.conf, used by the default profile.
_DEFAULT_MPM = {
    "prefork": ("StartServers 5\nMinSpareServers 5\nMaxSpareServers 10\n"
                "MaxRequestWorkers 150\nMaxConnectionsPerChild 0"),
    "worker": ("StartServers 2\nMinSpareThreads 25\nMaxSpareThreads 75\nThreadLimit 64\n"
               "ThreadsPerChild 25\nMaxRequestWorkers 150\nMaxConnectionsPerChild 0"),
    "event": ("StartServers 2\nMinSpareThreads 25\nMaxSpareThreads 75\nThreadLimit 64\n"
              "ThreadsPerChild 25\nMaxRequestWorkers 150\nMaxConnectionsPerChild 0"),
}


def tuned_mpm(mpm: str, connections: int) -> str:
    """MPM settings sized for `connections` at once.

    prefork needs a process per connection (S1 used 1,000); it is capped at 1,024 processes.
    worker and event run as one process (one process set pinned to the server CPU, like one
    nginx worker): worker needs a thread per connection (capped at 4,096 threads); event parks
    idle keep-alive connections without a thread, so AsyncRequestWorkerFactor is raised to
    let its threads carry all of them.
    """
    if mpm == "prefork":
        n = min(max(256, connections), 1024)
        return (f"StartServers 64\nMinSpareServers 64\nMaxSpareServers {n}\n"
                f"ServerLimit {n}\nMaxRequestWorkers {n}\nMaxConnectionsPerChild 0")
    if mpm == "worker":
        threads = min(max(256, connections), 4096)
        return (f"ServerLimit 1\nStartServers 1\nThreadLimit {threads}\nThreadsPerChild {threads}\n"
                f"MinSpareThreads 1\nMaxSpareThreads {threads}\nMaxRequestWorkers {threads}\n"
                "MaxConnectionsPerChild 0")
    threads = min(max(256, connections), 1024)
    factor = max(2, math.ceil(connections / threads) + 1)
    return (f"ServerLimit 1\nStartServers 1\nThreadLimit {threads}\nThreadsPerChild {threads}\n"
            f"MinSpareThreads 1\nMaxSpareThreads {threads}\nMaxRequestWorkers {threads}\n"
            f"AsyncRequestWorkerFactor {factor}\nMaxConnectionsPerChild 0")


def tls_lines(tls: TlsSite | None) -> str:
    """mod_ssl for the main server (and mod_http2 with --h2); protocols and ciphers are mod_ssl's
    defaults."""
    if tls is None:
        return ""
    lines = [f"LoadModule ssl_module {MODULES}/mod_ssl.so"]
    if tls.http2:
        lines.append(f"LoadModule http2_module {MODULES}/mod_http2.so")
    lines += ["SSLEngine on", f'SSLCertificateFile "{tls.cert}"', f'SSLCertificateKeyFile "{tls.key}"',
              "Protocols h2 http/1.1" if tls.http2 else "Protocols http/1.1"]
    if not tls.resumption:
        # No session cache is mod_ssl's default; tickets are on unless said.
        lines += ["SSLSessionCache none", "SSLSessionTickets off"]
    return "\n".join(lines)


class Apache(Server):
    family = "apache"
    program = "apache2"
    package = "apache2"
    config_file = "apache2.conf"
    pid_file = "apache2.pid"
    no_http3 = "Apache httpd 2.4 has no HTTP/3"

    def __init__(self, mpm: str):
        self.mpm = mpm
        self.name = f"apache-{mpm}"
        self.title = f"Apache httpd ({mpm})"

    def version(self) -> str:
        if not self.available():
            return "missing"
        from arena.tools import command_output
        out = command_output([self.binary(), "-v"])
        return out.splitlines()[0].split(": ", 1)[-1] + f" mpm_{self.mpm}" if out else "unknown"

    def transport_support(self, transport: str) -> str | None:
        if transport == "h2" and self.mpm == "prefork":
            return ("mod_http2 does not work under the prefork MPM: httpd logs AH10034 (\"the mpm module "
                    "(prefork.c) is not supported by mod_http2 ... the HTTP/2 protocol will be inactive\") and "
                    "ALPN never selects h2; prefork serves --tls (HTTP/1.1) only")
        return super().transport_support(transport)

    def transport_files(self, transport: str) -> tuple[tuple[Path, str], ...]:
        files = {"tls": ("mod_ssl.so",), "h2": ("mod_ssl.so", "mod_http2.so")}.get(transport, ())
        return tuple((MODULES / f, "apache2-bin") for f in files)

    def template_name(self, profile: str) -> str:
        return f"apache-{profile}.conf"

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        opts = site.options
        tuned = profile == "tuned"
        user = run_user()
        # Debian enables mod_deflate by default and its default site logs (combined).
        gzip = opts.gzip if opts.gzip is not None else not tuned
        access = opts.access_log if opts.access_log is not None else not tuned
        default_keepalive = 65 if tuned else 5
        modules = ""
        if gzip:
            modules = (f"LoadModule filter_module {MODULES}/mod_filter.so\n"
                       f"LoadModule deflate_module {MODULES}/mod_deflate.so")
        return {
            "rundir": rundir,
            "host": site.host,
            "port": site.port,
            "docroot": site.docroot,
            "mpm": self.mpm,
            "modules_dir": MODULES,
            "modules": modules,
            "user": f"User {user[0]}\nGroup {user[1]}" if user else "",
            "mpm_settings": tuned_mpm(self.mpm, opts.connections) if tuned else _DEFAULT_MPM[self.mpm],
            "keepalive_timeout": opts.keepalive_timeout if opts.keepalive_timeout is not None
            else default_keepalive,
            "access_log": (f'LogFormat "%h %l %u %t \\"%r\\" %>s %O \\"%{{Referer}}i\\" '
                           f'\\"%{{User-Agent}}i\\"" combined\n'
                           f'CustomLog "{rundir}/access.log" combined') if access else "",
            "gzip": "AddOutputFilterByType DEFLATE text/html text/plain text/xml text/css" if gzip else "",
            "tls": tls_lines(opts.tls),
        }

    def command(self, binary: str, rundir: Path) -> list[str]:
        return [binary, "-d", str(rundir), "-f", str(rundir / self.config_file), "-DFOREGROUND"]
