"""What every server adapter shares: rendering its config, starting it pinned on a free
loopback port, waiting until it answers HTTP, and stopping its whole process tree by pid.

An adapter only says which binary it runs, which files its templates produce, which values
they need, and how its command line looks.
"""

from __future__ import annotations

import grp
import os
import pwd
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from arena import ports, procs, tls
from arena.errors import ArenaError
from arena.quota import CpuQuota
from arena.render import render, template
from arena.servers import sites
from arena.tools import command_output, require

PROFILES = ("tuned", "default")
START_TIMEOUT = 20.0


@dataclass
class TlsSite:
    """TLS on the site's port: the `--tls`, `--h2` and `--h3` variants (arena/tls.py)."""
    cert: Path
    key: Path
    # ALPN offers h2 (--h2). Without it a server offers only HTTP/1.1 where its config can say
    # so; the clients of a --tls run offer only http/1.1 anyway (wrk offers no ALPN at all).
    http2: bool = False
    # HTTP/3 over QUIC on the same port number, UDP, beside TLS on TCP (--h3).
    http3: bool = False
    # False: session tickets and the session cache are turned off in every server, so each new
    # connection is a full handshake whatever the client offers (wrk and h2load both resume).
    resumption: bool = False


@dataclass
class SiteOptions:
    """What a scenario asks of every server. None means "the profile's own choice"."""
    gzip: bool | None = None
    keepalive_timeout: int | None = None
    access_log: bool | None = None
    # The most connections the scenario opens at once; tuned profiles size their limits to it.
    connections: int = 1024
    # What is served (arena/servers/sites.py): the site kind, its document root (None: the
    # arena's generated one) and the values the kind's templates need.
    kind: str = "static"
    docroot: Path | None = None
    app: dict[str, object] = field(default_factory=dict)
    # TLS on the port (None: cleartext).
    tls: TlsSite | None = None


@dataclass
class Site:
    docroot: Path
    port: int
    options: SiteOptions
    host: str = ports.HOST

    @property
    def scheme(self) -> str:
        return "https" if self.options.tls else "http"

    def client_tls(self) -> ssl.SSLContext | None:
        """A context for the arena's own HTTP/1.1 requests to the site: it verifies the run's
        certificate. None for a cleartext site."""
        if self.options.tls is None:
            return None
        return tls.client_context(self.options.tls.cert, ["http/1.1"])


def run_user() -> tuple[str, str] | None:
    """(user, group) that servers started as root should drop to; None when not root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("www-data")
        return "www-data", "www-data"
    except KeyError:
        return "nobody", "nogroup"


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def http_status(host: str, port: int, path: str = "/", timeout: float = 1.0,
                context: ssl.SSLContext | None = None) -> str | None:
    """The status line of a GET (over TLS with `context`), or None if nothing answered HTTP."""
    try:
        with tls.connect(host, port, timeout, context) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while b"\r\n" not in data and len(data) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    return line if line.startswith("HTTP/") else None


class Server:
    """An adapter. Subclasses set the class attributes and may override the hooks."""

    name = ""            # CLI name, e.g. "apache-event"
    title = ""           # for reports, e.g. "Apache httpd (event)"
    program = ""         # executable looked up on PATH
    package = ""         # Debian package providing it
    family = ""          # template family (templates/sites/<family>-<kind>.conf); "" = name
    config_file = ""     # main config file written into the run directory
    pid_file = ""        # file the server writes its pid to, relative to the run directory
    reference = False    # a reference row (the floor), not a web server people run
    # Why it cannot serve HTTP/3 (--h3); None for those that can (gannet, Caddy).
    no_http3: str | None = "it has no HTTP/3"

    # -- hooks -----------------------------------------------------------------------------
    def binary(self) -> str:
        return require(self.program)

    version_flag = "-v"  # what makes the binary print its version (first line kept)

    def version(self) -> str:
        if not self.available():
            return "missing"
        return command_output([self.binary(), self.version_flag]).strip().splitlines()[0]

    def available(self) -> bool:
        try:
            self.binary()
            return True
        except ArenaError:
            return False

    def template_name(self, profile: str) -> str:
        return f"{self.name}-{profile}.conf"

    def site_template_name(self, kind: str, profile: str) -> str:
        return sites.snippet_name(self.name, self.family or self.name, kind, profile)

    def serves(self, kind: str, profile: str) -> bool:
        return sites.supports(self.name, self.family or self.name, kind, profile)

    def values(self, site: Site, rundir: Path, profile: str) -> dict[str, object]:
        """Placeholder values for this server's template."""
        raise NotImplementedError

    def transport_support(self, transport: str) -> str | None:
        """None when the server can serve `transport` (arena/tls.py); else the reason it
        cannot, which the run reports when it leaves the server out."""
        return self.no_http3 if transport == "h3" else None

    def transport_files(self, transport: str) -> tuple[tuple[Path, str], ...]:
        """Files (modules) the server needs for `transport`, each with its Debian package."""
        return ()

    def check_transport(self, transport: str) -> None:
        """Raise a clear ArenaError if a module the transport needs is not installed."""
        for path, package in self.transport_files(transport):
            if not Path(path).exists():
                raise ArenaError(f"{self.name} needs {path} for {tls.LABELS[transport]}: install the Debian "
                                 f"package '{package}' (apt-get install {package}, or `arena peers install`)")

    def command(self, binary: str, rundir: Path) -> list[str]:
        raise NotImplementedError

    def site_command(self, binary: str, rundir: Path, site: Site, profile: str) -> list[str]:
        """The command line for `site`: `command()`, for servers whose config names their
        address; a server that takes it on its command line (Varnish) overrides this."""
        return self.command(binary, rundir)

    def environment(self, rundir: Path, profile: str) -> dict[str, str]:
        return {}

    def error_log(self, rundir: Path) -> Path:
        return rundir / "error.log"

    # -- shared ----------------------------------------------------------------------------
    def configs(self, site: Site, rundir: Path, profile: str) -> dict[str, str]:
        """File name -> rendered text of every config file this server needs."""
        if profile not in PROFILES:
            raise ArenaError(f"unknown profile '{profile}': choose from {', '.join(PROFILES)}")
        kind = site.options.kind
        own = self.values(site, rundir, profile)
        snippet = template(self.site_template_name(kind, profile))
        if sites.kind(kind).whole:
            # The snippet is the whole config: the server's values it does not name are for
            # its usual template, not errors.
            values = {**own, **sites.app_values(kind, site.options.app)}
            return {self.config_file: render(snippet, values, (*sites.kind(kind).optional, *own))}
        main = self.template_name(profile)
        text = sites.inline(template(main), snippet, main)
        if sites.SITE_HTTP_LINE.search(text):
            http = sites.http_snippet_name(self.name, self.family or self.name, kind, profile)
            text = sites.inline(text, template(http) if http else "", main, sites.SITE_HTTP_LINE)
        values = {**own, **sites.app_values(kind, site.options.app)}
        return {self.config_file: render(text, values, sites.kind(kind).optional)}

    def start(self, site: Site, rundir: Path, profile: str, cpus: str,
              quota: CpuQuota | None = None) -> "RunningServer":
        """Start pinned to `cpus` (and inside `quota`'s cgroup), wait until it answers HTTP,
        return the handle."""
        binary = self.binary()
        ports.check_free(site.port, site.host)
        rundir.mkdir(parents=True, exist_ok=True)
        # Servers started as root drop to www-data, which must still reach its files.
        rundir.chmod(0o755)
        user = run_user()
        if user:
            # lighttpd and h2o open their logs and pid file after dropping privileges.
            os.chown(rundir, pwd.getpwnam(user[0]).pw_uid, grp.getgrnam(user[1]).gr_gid)
        configs = self.configs(site, rundir, profile)
        for name, text in configs.items():
            (rundir / name).write_text(text)
        env = dict(os.environ)
        env.update(self.environment(rundir, profile))
        cmd = procs.pinned(self.site_command(binary, rundir, site, profile), cpus)

        def child_setup() -> None:
            # In the child, before it execs: everything it starts inherits both.
            procs.raise_nofile_limit()
            if quota:
                quota.enter()
        output = rundir / "output.log"
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=rundir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                preexec_fn=child_setup,
                # Own session: the terminal's Ctrl-C reaches only the arena, which stops
                # servers itself, in order.
                start_new_session=True,
            )
        running = RunningServer(self, site, rundir, proc, cmd, configs, profile, quota=quota)
        running.wait_ready()
        return running


@dataclass
class RunningServer:
    server: Server
    site: Site
    rundir: Path
    proc: subprocess.Popen
    command: list[str]
    configs: dict[str, str]
    profile: str
    probes: dict = field(default_factory=dict)
    quota: CpuQuota | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def name(self) -> str:
        return self.server.name

    def url(self, path: str) -> str:
        return f"{self.site.scheme}://{self.site.host}:{self.site.port}{path}"

    def tree(self) -> list[int]:
        return procs.process_tree(self.pid)

    def _failure(self, what: str) -> ArenaError:
        logs = [self.server.error_log(self.rundir), self.rundir / "output.log"]
        text = "\n".join(t for t in (tail(p) for p in logs) if t)
        if "in use" in text.lower() and "address" in text.lower():
            return ArenaError(f"{self.name}: port {self.site.host}:{self.site.port} is in use "
                              f"(the server could not bind it)\n{text}")
        detail = f"\nlast lines of its logs ({self.rundir}):\n{text}" if text else \
            f"\n(its logs in {self.rundir} are empty)"
        return ArenaError(f"{self.name} {what}{detail}")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Poll until the server answers HTTP; on exit or timeout raise with its log tail."""
        deadline = time.monotonic() + timeout
        context = self.site.client_tls()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self._failure(f"failed to start (exit code {code})")
            if http_status(self.site.host, self.site.port, "/robots.txt", timeout=0.5, context=context):
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise self._failure(f"did not answer HTTP within {timeout:.0f} s")
            time.sleep(0.05)  # poll interval under a deadline

    def stop(self) -> None:
        procs.stop_tree(self.pid, reap=self.proc.poll)
        if self.quota:
            self.quota.close()
