"""Debian's nginx as a reference peer for differential tests: the same config text as gannet
(with `{port}`, `{root}`, `{tmp}` and `{repo}` filled in as the harness does), run in the
foreground under its own prefix, stopped at teardown; plus a tiny raw HTTP/1.1 client whose
answers can be compared field by field.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from conftest import REPO, Gannet, free_port, gannet_bin, wait_port

# None when nginx is not installed: differential tests skip (scripts/test-all.sh installs it).
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)

# The main context every differential config starts with (`{tmp}` as `render` fills it).
PEER_MAIN = r"""
user root;
worker_processes 1;
pid {tmp}/server.pid;
error_log {tmp}/error.log info;
events { worker_connections 64; }
"""


def render(conf: str, port: int, root: Path, tmp: Path) -> str:
    return conf.replace("{port}", str(port)).replace("{root}", str(root)).replace("{tmp}", str(tmp)).replace("{repo}", str(REPO))


class NginxPeer:
    """nginx running `conf` with its pid and logs under `tmp` and documents in `root`."""

    def __init__(self, conf: str, port: int, root: Path, tmp: Path):
        self.port, self.tmp = port, tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.conf_path = tmp / "nginx.conf"
        self.conf_path.write_text(render(conf, port, root, tmp))
        self.proc = subprocess.Popen(
            [NGINX, "-p", f"{tmp}/", "-c", str(self.conf_path), "-g", "daemon off;"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            wait_port(port, self.proc)
        except RuntimeError as e:
            self.stop()
            raise AssertionError(f"nginx did not start: {e}\n{self.proc.stderr.read().decode(errors='replace')}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def side_by_side(tmp_path: Path, conf: str, files: dict | None = None):
    """gannet and nginx on the same config and document root (`files`), each with its own
    logs (`tmp_path/gannet`, `tmp_path/nginx`): yields gannet's `Server` and nginx's port."""
    g = Gannet(tmp_path / "gannet")
    g.tmp.mkdir()
    root = g.write_files(files)
    nginx_port = free_port()
    nginx = NginxPeer(conf, nginx_port, root, tmp_path / "nginx")
    try:
        yield g.start(conf=conf), nginx_port
    finally:
        nginx.stop()
        g.close()


def check_both(tmp_path: Path, http: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """`nginx -t` and `gannet -t` on one config: PEER_MAIN, then `http { <http> }` with a
    server of its own after what `http` holds."""
    conf = tmp_path / "check.conf"
    conf.write_text(PEER_MAIN.replace("{tmp}", str(tmp_path)) + "http {\n" + http + "\nserver { listen 127.0.0.1:1; }\n}\n")
    n = subprocess.run([NGINX, "-t", "-p", f"{tmp_path}/", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    g = subprocess.run([str(gannet_bin()), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    return n, g


@dataclass
class Answer:
    """One parsed response: status, headers (lower-case names, repeats joined by ", "), body."""

    status: int
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    raw: bytes = b""


def exchange(port: int, request: bytes, timeout: float = 5.0) -> Answer:
    """Send raw bytes (the request should say Connection: close), read to EOF, parse."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        try:
            while b := s.recv(65536):
                chunks.append(b)
        except (socket.timeout, ConnectionResetError):
            pass
    return parse(b"".join(chunks), head_request=request.startswith(b"HEAD "))


def exchange_from(port: int, data: bytes, source: str) -> tuple[bytes, int]:
    """Send raw bytes from the loopback address `source`, read to EOF (or a reset): what
    came back, and our own port (to blank it out of answers that show it)."""
    with socket.socket() as s:
        s.settimeout(5)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(data)
        chunks = []
        try:
            while b := s.recv(65536):
                chunks.append(b)
        except ConnectionResetError:
            pass
        return b"".join(chunks), s.getsockname()[1]


def parse(raw: bytes, head_request: bool = False) -> Answer:
    if not raw:
        return Answer(status=0, raw=raw)
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if headers.get("transfer-encoding", "").lower() == "chunked" and not head_request:
        body = dechunk(body)
    return Answer(status=int(status_line.split()[1]), headers=headers, body=body, raw=raw)


def dechunk(data: bytes) -> bytes:
    out = []
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(data[:size])
        data = data[size + 2 :]
    return b"".join(out)
