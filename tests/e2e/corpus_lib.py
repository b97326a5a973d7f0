"""The config corpus (tests/configs/): real-world nginx configs run unchanged by gannet and by
Debian's nginx, every request of a config's `requests.yaml` sent to both, the parts that
matter compared. Shared by tests/e2e/test_config_corpus.py and scripts/config-corpus.py.

Each config directory holds `site.conf` (what a project tells you to drop into
sites-enabled/ or conf.d/, so it is included inside `http {}`) and `requests.yaml`. The
placeholders `@ROOT@ @PORT@ @TLSPORT@ @UPSTREAM@ @AUTH@ @FPM@ @CERT@ @KEY@ @DHPARAM@ @HTPASSWD@
@TMP@` are filled per server (see tests/configs/README.md); both servers also get Debian's
fastcgi.conf, fastcgi_params, proxy_params, mime.types and snippets/ next to their config, so
a relative `include` finds the same files in both.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import socketserver
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from conftest import REPO, free_port, gannet_bin, wait_port, wait_until
from nginx_peer import NGINX, Answer, parse

CONFIGS = REPO / "tests" / "configs"
DEBIAN_ETC = Path("/etc/nginx")
PHP_FPM = shutil.which("php-fpm8.2") or shutil.which("php-fpm")

MAIN = """user root;
worker_processes 1;
pid @TMP@/server.pid;
error_log @TMP@/error.log info;
events { worker_connections 256; }
http {
    include mime.types;
    default_type application/octet-stream;
    access_log @TMP@/access.log;
    include site.conf;
}
"""

# What `@PHP@` in a config's `files` becomes: a script that shows what it was given.
PHP_ECHO = """<?php
header('Content-Type: application/json');
$keys = ['SCRIPT_FILENAME', 'SCRIPT_NAME', 'REQUEST_URI', 'DOCUMENT_URI', 'DOCUMENT_ROOT', 'QUERY_STRING',
         'REQUEST_METHOD', 'CONTENT_TYPE', 'CONTENT_LENGTH', 'HTTP_HOST', 'PATH_INFO', 'PATH_TRANSLATED',
         'REDIRECT_STATUS', 'HTTPS', 'SERVER_NAME', 'SERVER_PORT', 'HTTP_PROXY', 'REMOTE_USER', 'FRONT_CONTROLLER_ACTIVE',
         'modHeadersAvailable', 'front_controller_active'];
$out = [];
foreach ($keys as $k) { if (isset($_SERVER[$k])) { $out[$k] = $_SERVER[$k]; } }
$out['body'] = file_get_contents('php://input');
echo json_encode($out, JSON_UNESCAPED_SLASHES | JSON_PRETTY_PRINT), "\\n";
"""


def config_names() -> list[str]:
    return sorted(p.name for p in CONFIGS.iterdir() if (p / "site.conf").exists())


def known_gaps() -> dict[str, str]:
    """`- **name**: reason` lines of tests/configs/KNOWN_GAPS.md, by config name."""
    gaps = {}
    for line in (CONFIGS / "KNOWN_GAPS.md").read_text().splitlines():
        m = re.match(r"^- \*\*([\w.-]+)\*\*: (.+)$", line)
        if m:
            gaps[m.group(1)] = m.group(2)
    return gaps


# ---------------------------------------------------------------- helper services


class _Echo(BaseHTTPRequestHandler):
    """The upstream: answers every request with what it received (method, path, headers, body)
    as JSON; answers an Upgrade with 101 and the same JSON on the upgraded stream."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _seen(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode(errors="replace") if n else ""
        hdrs = [[k.lower(), v] for k, v in self.headers.items()]
        return (json.dumps({"method": self.command, "path": self.path, "version": self.request_version,
                            "headers": hdrs, "body": body}, indent=1) + "\n").encode()

    def _any(self):
        data = self._seen()
        if self.headers.get("Upgrade"):
            self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + self.headers["Upgrade"].encode()
                             + b"\r\nConnection: Upgrade\r\n\r\n" + data)
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Upstream", "echo")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = _any


class _Auth(_Echo):
    """The SSO service behind `auth_request`: 200 with identity headers when the request
    carries `Cookie: session=ok` (or `Authorization: Bearer ok`), else 401; any path."""

    def _any(self):
        self._seen()
        ok = "session=ok" in (self.headers.get("Cookie") or "") or self.headers.get("Authorization") == "Bearer ok"
        self.send_response(200 if ok else 401)
        if not ok:
            self.send_header("Location", "https://auth.example.com/?rd=" + self.path)
        if ok:
            for k, v in (("X-Auth-Request-User", "alice"), ("X-Auth-Request-Email", "alice@example.com"),
                         ("Remote-User", "alice"), ("Remote-Groups", "admins"), ("Remote-Name", "Alice"),
                         ("Remote-Email", "alice@example.com"), ("X-Auth-Request-Access-Token", "tok")):
                self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = _any


class _UnixHTTP(socketserver.ThreadingUnixStreamServer):
    """The echo upstream on a unix socket too (`server unix:...`, `proxy_pass http://unix:...:`)."""

    daemon_threads = True

    def get_request(self):
        conn, _ = super().get_request()
        return conn, ("unix", 0)


class Services:
    """The echo upstream, the auth service, PHP-FPM and TLS material, shared by every config."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.servers = []
        self.upstream = self._serve(_Echo)
        self.auth = self._serve(_Auth)
        self.upstream_sock = str(tmp / "upstream.sock")
        usrv = _UnixHTTP(self.upstream_sock, _Echo)
        threading.Thread(target=usrv.serve_forever, daemon=True).start()
        self.servers.append(usrv)
        self._pki()
        self.fpm_proc = None
        self.fpm = "127.0.0.1:1"
        if PHP_FPM:
            self._fpm()

    def _serve(self, handler) -> str:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.servers.append(srv)
        return f"127.0.0.1:{srv.server_address[1]}"

    def _pki(self) -> None:
        def run(*a):
            subprocess.run(["openssl", *a], cwd=self.tmp, check=True, capture_output=True, timeout=60)

        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "key.pem",
            "-out", "cert.pem", "-days", "2", "-subj", "/CN=example.com",
            "-addext", "subjectAltName=DNS:example.com,DNS:*.example.com,DNS:localhost")
        run("genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt", "group:ffdhe2048", "-out", "dhparam.pem")
        # alice:secret, in the {PLAIN}-free apr1 form htpasswd writes
        out = subprocess.run(["openssl", "passwd", "-apr1", "secret"], capture_output=True, text=True, check=True)
        (self.tmp / "htpasswd").write_text(f"alice:{out.stdout.strip()}\n")

    def _fpm(self) -> None:
        sock = self.tmp / "php.sock"
        conf = self.tmp / "php-fpm.conf"
        conf.write_text(f"""[global]
pid = {self.tmp}/php-fpm.pid
error_log = {self.tmp}/php-fpm.log
daemonize = no
[www]
listen = {sock}
pm = static
pm.max_children = 2
catch_workers_output = no
php_admin_value[display_errors] = Off
""")
        self.fpm_proc = subprocess.Popen([PHP_FPM, "-F", "-y", str(conf), "-R"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_until(sock.exists, deadline=15):
            raise AssertionError("php-fpm did not start")
        self.fpm = f"unix:{sock}"

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
        if self.fpm_proc:
            self.fpm_proc.send_signal(signal.SIGQUIT)
            try:
                self.fpm_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.fpm_proc.kill()


# ---------------------------------------------------------------- one server on one config


@dataclass
class Instance:
    """A prefix directory with the mapped config, its document root and its ports."""

    kind: str  # "gannet" or "nginx"
    dir: Path
    subst: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def port(self) -> int:
        return int(self.subst["@PORT@"])

    @property
    def tlsport(self) -> int:
        return int(self.subst["@TLSPORT@"])

    def argv(self, *extra: str) -> list[str]:
        conf = str(self.dir / "nginx.conf")
        if self.kind == "nginx":
            return [NGINX, "-p", f"{self.dir}/", "-c", conf, *extra]
        return [str(gannet_bin()), "-c", conf, *extra]

    def test(self) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv("-t"), capture_output=True, text=True, timeout=30)

    def start(self) -> None:
        extra = ("-g", "daemon off;") if self.kind == "nginx" else ()
        self.proc = subprocess.Popen(self.argv(*extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            site = (self.dir / "site.conf").read_text()
            wait_port(self.port if self.subst["@PORT@"] in site else self.tlsport, self.proc)
        except RuntimeError as e:
            self.stop()
            raise AssertionError(f"{self.kind} did not start: {e}\n{self.proc.stderr.read().decode(errors='replace')}") from None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT if self.kind == "nginx" else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def normalize(self, text: str) -> str:
        """Paths and ports of this instance back to their placeholders, so answers compare."""
        for k in ("@ROOT@", "@TMP@", "@TLSPORT@", "@PORT@"):
            text = text.replace(self.subst[k], k)
        return text


def prepare(name: str, kind: str, base: Path, svc: Services) -> Instance:
    d = base / kind
    d.mkdir(parents=True)
    spec = load(name)
    subst = {
        "@ROOT@": str(d / "www"), "@TMP@": str(d), "@PORT@": str(free_port()), "@TLSPORT@": str(free_port()),
        "@UPSTREAM@": svc.upstream, "@UPSTREAM_SOCK@": svc.upstream_sock, "@AUTH@": svc.auth, "@FPM@": svc.fpm,
        "@CERT@": str(svc.tmp / "cert.pem"), "@KEY@": str(svc.tmp / "key.pem"),
        "@DHPARAM@": str(svc.tmp / "dhparam.pem"), "@HTPASSWD@": str(svc.tmp / "htpasswd"),
    }
    for f in ("fastcgi.conf", "fastcgi_params", "proxy_params", "mime.types", "uwsgi_params", "scgi_params"):
        shutil.copy(DEBIAN_ETC / f, d / f)
    shutil.copytree(DEBIAN_ETC / "snippets", d / "snippets")

    def fill(text: str) -> str:
        for k, v in subst.items():
            text = text.replace(k, v)
        return text

    (d / "nginx.conf").write_text(fill(MAIN))
    (d / "site.conf").write_text(fill((CONFIGS / name / "site.conf").read_text()))
    root = d / "www"
    root.mkdir()
    for rel, content in (spec.get("files") or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(PHP_ECHO if content == "@PHP@" else str(content))
    return Instance(kind, d, subst)


def load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name / "requests.yaml").read_text()) or {}


# ---------------------------------------------------------------- requests and comparison


def send(inst: Instance, req: dict) -> Answer:
    method = req.get("method", "GET")
    host = req.get("host", "example.com")
    headers = {"Host": host, **(req.get("headers") or {})}
    body = (req.get("body") or "").encode()
    if body or method in ("POST", "PUT"):
        headers.setdefault("Content-Length", str(len(body)))
    if "Upgrade" not in headers:
        headers.setdefault("Connection", "close")
    head = f"{method} {req['path']} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    tls = req.get("tls", False)
    port = inst.tlsport if tls else inst.port
    raw = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            s = ctx.wrap_socket(s, server_hostname=host.split(":")[0])
        s.sendall(head.encode() + body)
        try:
            while b := s.recv(65536):
                raw += b
        except (socket.timeout, ConnectionResetError, ssl.SSLError):
            pass
    return parse(raw, head_request=method == "HEAD")


def _from_date(date: str, expires: str) -> str:
    """An Expires as its distance from the same answer's Date (`Date+604800`): two servers
    asked a moment apart may straddle a second."""
    try:
        delta = parsedate_to_datetime(expires) - parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return expires
    return f"Date{int(delta.total_seconds()):+d}"


def view(inst: Instance, req: dict, ans: Answer) -> dict:
    """The parts of an answer that matter for this request, normalized."""
    out = {"status": ans.status}
    for part in req.get("compare") or []:
        if part.lower() == "expires" and "date" in ans.headers:
            out["expires"] = _from_date(ans.headers["date"], ans.headers.get("expires", "<absent>"))
            continue
        if part != "body":
            out[part.lower()] = inst.normalize(ans.headers.get(part.lower(), "<absent>"))
            continue
        body = ans.body.decode(errors="replace")
        if ans.status == 101:
            body = ans.raw.partition(b"\r\n\r\n")[2].decode(errors="replace")
        out["body"] = inst.normalize(_unordered(body))
    return out


def _unordered(body: str) -> str:
    """The echo upstream's JSON with the headers it received sorted: nginx and gannet may
    order proxied headers differently (nginx: the configured ones first, its own Host and
    Connection after), which no upstream depends on, so only the set of headers is compared."""
    try:
        seen = json.loads(body)
        seen["headers"] = sorted(seen["headers"])
    except (ValueError, KeyError, TypeError):
        return body
    return json.dumps(seen, indent=1)


@dataclass
class Result:
    name: str
    loaded: bool = True
    load_error: str = ""
    rows: list = field(default_factory=list)  # (request label, gannet view, nginx view, expected ok)

    @property
    def matched(self) -> int:
        return sum(1 for _, g, n, ok in self.rows if g == n and ok)

    @property
    def passed(self) -> bool:
        return self.loaded and self.matched == len(self.rows)

    def report(self) -> str:
        if not self.loaded:
            return f"{self.name}: gannet cannot load the config:\n{self.load_error}"
        lines = []
        for label, g, n, ok in self.rows:
            if not ok:
                lines.append(f"{label}: nginx answered {n} (not the status requests.yaml expects)")
            elif g != n:
                diff = {k: {"gannet": g.get(k), "nginx": n.get(k)} for k in sorted(set(g) | set(n)) if g.get(k) != n.get(k)}
                lines.append(f"{label}: {json.dumps(diff, indent=1)}")
        return "\n".join(lines)


def run_config(name: str, base: Path, svc: Services) -> Result:
    """`nginx -t` (must pass: the corpus is valid nginx) and `gannet -t`, then both started once
    and every request sent to both."""
    spec = load(name)
    ng = prepare(name, "nginx", base, svc)
    ga = prepare(name, "gannet", base, svc)
    t = ng.test()
    assert t.returncode == 0, f"nginx -t refuses {name}:\n{t.stderr}"
    t = ga.test()
    if t.returncode != 0:
        return Result(name, loaded=False, load_error=t.stderr.strip())
    res = Result(name)
    ng.start()
    try:
        ga.start()
    except AssertionError as e:
        ng.stop()
        return Result(name, loaded=False, load_error=str(e))
    try:
        for i, req in enumerate(spec.get("requests") or []):
            label = f"#{i} {req.get('method', 'GET')} {'https' if req.get('tls') else 'http'}://{req.get('host', 'example.com')}{req['path']}"
            n = view(ng, req, send(ng, req))
            g = view(ga, req, send(ga, req))
            ok = "status" not in req or n["status"] == req["status"]
            res.rows.append((label, g, n, ok))
    finally:
        ga.stop()
        ng.stop()
    return res
