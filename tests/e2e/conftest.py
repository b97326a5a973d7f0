"""End-to-end harness: the real gannet binary, a temp config and document root, a port
allocated per test, and real clients (raw sockets, http.client, curl).

Use the `gannet` fixture:

    def test_x(gannet):
        srv = gannet.start(server="location / { autoindex on; }", files={"a.txt": "hi"})
        status, headers, body = srv.get("/a.txt")

`server=` goes inside the default `server {}` block (which already has `listen` and `root`),
`http=` inside `http {}` before it, `main=` at the top; or pass `conf=` for a whole config
where `{port}`, `{root}`, `{tmp}` and `{repo}` are replaced.
"""

from __future__ import annotations

import collections
import http.client
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def gannet_bin() -> Path:
    env = os.environ.get("GANNET_BIN")
    if env:
        return Path(env)
    # The most recently built of the two, so a stale release build never hides a fix.
    built = [p for p in (REPO / "target" / k / "gannet" for k in ("release", "debug")) if p.exists()]
    if built:
        return max(built, key=lambda p: p.stat().st_mtime)
    raise RuntimeError("gannet binary not found: run `cargo build --release` first or set GANNET_BIN")


_GIVEN: "collections.deque[int]" = collections.deque(maxlen=4096)


def free_port() -> int:
    """A port free now, and not one handed out recently: the kernel may give the same
    ephemeral port to two binds in a row (`p, q = free_port(), free_port()` was once a
    duplicate listen)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.append(port)
            return port


def wait_until(fn, deadline: float = 5.0, every: float = 0.02):
    """Poll `fn` until it returns something truthy or the deadline passes; return its last value."""
    end = time.monotonic() + deadline
    while True:
        v = fn()
        if v or time.monotonic() > end:
            return v
        time.sleep(every)


def log_lines(path: Path, n: int) -> list[str]:
    """The sorted lines of the log at `path` once it has at least `n` (a server writes its
    access log after the answer, so a client that has its answer waits for the line)."""
    got = wait_until(lambda: path.exists() and len(path.read_text().splitlines()) >= n and path.read_text())
    assert got, f"fewer than {n} lines in {path}"
    return sorted(got.splitlines())


def wait_port(port: int, proc: subprocess.Popen | None = None, deadline: float = 10.0) -> None:
    """Poll until something accepts on the port (or the process died)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port} after {deadline}s")


def read_head(f) -> bytes:
    """The status line and headers from a socket file, up to the empty line."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = f.readline()
        if not line:
            raise AssertionError(f"connection closed inside the head: {head!r}")
        head += line
    return head


def read_chunked(f) -> bytes:
    """A chunked body from a socket file, up to and including its last (empty) chunk."""
    body = bytearray()
    while True:
        n = int(f.readline().strip(), 16)
        chunk = f.read(n + 2)
        if n == 0:
            return bytes(body)
        body += chunk[:-2]


def worker_pids(master: int) -> list[int]:
    """The children of `master` named as gannet names its worker processes, oldest first."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[1]) == master and name == "gannet: worker" and rest[0] != "Z":
            found.append((int(rest[19]), int(entry)))  # field 22: start time
    return [pid for _, pid in sorted(found)]


def root_default(conf: str) -> bool:
    """Whether a whole config (one with `events`) run as root names no `user`: the harness
    then adds `user root;` (see `Gannet.render`)."""
    return os.geteuid() == 0 and "events" in conf and not re.search(r"(^|[;{}\s])user\s", conf)


DEFAULT_CONF = """
worker_processes 1;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log info;
{main}
events {{ worker_connections 1024; }}
http {{
    include {repo}/conf/mime.types;
    default_type application/octet-stream;
    access_log {tmp}/access.log;
    {http}
    server {{
        listen 127.0.0.1:{port};
        root {root};
        {server}
    }}
}}
"""


class Server:
    def __init__(self, tmp: Path, port: int, proc: subprocess.Popen, conf_path: Path):
        self.tmp, self.port, self.proc, self.conf_path = tmp, port, proc, conf_path
        self.root = tmp / "www"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, headers: dict | None = None, body: bytes | None = None, port: int | None = None):
        """One request on a fresh connection: (status, headers as lower-case dict, body)."""
        c = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=10)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def get(self, path: str, headers: dict | None = None, **kw):
        return self.request("GET", path, headers, **kw)

    def raw(self, data: bytes, timeout: float = 5.0) -> bytes:
        """Send raw bytes, read until the server closes (or the timeout)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            chunks = []
            try:
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    chunks.append(b)
            except socket.timeout:
                pass
            return b"".join(chunks)

    def error_log(self) -> str:
        p = self.tmp / "error.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def access_log(self) -> str:
        p = self.tmp / "access.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def worker_pids(self) -> list[int]:
        """The master's worker processes (one; two or more while a reload drains the old)."""
        return worker_pids(self.proc.pid)

    def worker_pid(self, deadline: float = 5.0) -> int:
        """The worker process, the one holding the worker threads, once there is only one."""
        pids = wait_until(lambda: len(self.worker_pids()) == 1 and self.worker_pids(), deadline)
        assert pids, f"not one worker process: {self.worker_pids()}"
        return pids[0]

    def stop(self, sig=signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Gannet:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.servers: list[Server] = []

    def write_files(self, files: dict | None) -> Path:
        root = self.tmp / "www"
        root.mkdir(exist_ok=True)
        for name, content in (files or {}).items():
            p = root / name
            p.parent.mkdir(parents=True, exist_ok=True)
            if content is None:
                p.mkdir(exist_ok=True)
            else:
                p.write_bytes(content.encode() if isinstance(content, str) else content)
        return root

    def render(self, conf: str | None = None, server: str = "", http: str = "", main: str = "", port: int | None = None, as_root: bool = True) -> tuple[str, int]:
        """The config text and its port; `as_root=False` leaves a config without `user` to
        run its workers as gannet's default account."""
        port = port or free_port()
        root = self.tmp / "www"
        if conf is None:
            # Started as root, gannet's workers run as nobody unless told otherwise (as
            # nginx's); the tests' files are in root's 0700 temp folders, so the default
            # config keeps them root, as the differential peer's does (test_privileges
            # covers the default account).
            if as_root and root_default(main + "events"):
                main = "user root;\n" + main
            text = DEFAULT_CONF.format(tmp=self.tmp, repo=REPO, port=port, root=root, server=server, http=http, main=main)
        else:
            text = conf.replace("{port}", str(port)).replace("{root}", str(root)).replace("{tmp}", str(self.tmp)).replace("{repo}", str(REPO))
            if as_root and root_default(text):
                # At the end, so the lines the tests name keep their numbers.
                text += "\nuser root;\n"
        return text, port

    def start(self, conf: str | None = None, files: dict | None = None, server: str = "", http: str = "", main: str = "", port: int | None = None, wait: bool = True, as_root: bool = True) -> Server:
        self.write_files(files)
        text, port = self.render(conf, server, http, main, port, as_root)
        conf_path = self.tmp / "gannet.conf"
        conf_path.write_text(text)
        proc = subprocess.Popen([str(gannet_bin()), "-c", str(conf_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        srv = Server(self.tmp, port, proc, conf_path)
        self.servers.append(srv)
        if wait:
            try:
                wait_port(port, proc)
            except RuntimeError as e:
                srv.stop()
                out, err = proc.communicate()
                raise AssertionError(f"gannet did not start: {e}\nstderr:\n{err.decode(errors='replace')}") from None
        return srv

    def check(self, conf: str | None = None, files: dict | None = None, **kw) -> subprocess.CompletedProcess:
        """`gannet -t` on a rendered config."""
        self.write_files(files)
        text, _ = self.render(conf, **kw)
        conf_path = self.tmp / "check.conf"
        conf_path.write_text(text)
        return subprocess.run([str(gannet_bin()), "-t", "-c", str(conf_path)], capture_output=True, text=True, timeout=30)

    def close(self) -> None:
        for s in self.servers:
            s.stop()


@pytest.fixture
def gannet(tmp_path):
    g = Gannet(tmp_path)
    yield g
    g.close()
