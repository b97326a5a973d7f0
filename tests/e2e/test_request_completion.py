"""`$request_completion`: `OK` in the log line of an answer sent whole (a file, a 404, a
HEAD), empty for one the client cut off midway; side by side with Debian's nginx."""

from __future__ import annotations

import socket
import struct

import pytest

from conftest import log_lines
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format done "$request_method $uri $status [$request_completion]";
    access_log {tmp}/access.log done;
    root {root};
    server {
        listen 127.0.0.1:{port};
    }
}
"""

FILES = {"small.txt": "small\n", "big.bin": "x" * (16 << 20)}


def cut_off(port: int) -> None:
    """Ask for the big file, take a little of it and reset the connection."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
    assert s.recv(1024)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def lines(tmp, n: int) -> list[str]:
    return log_lines(tmp / "access.log", n)


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_request_completion_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for port in (nginx_port, srv.port):
            for method, path in (("GET", "/small.txt"), ("HEAD", "/small.txt"), ("GET", "/none")):
                exchange(port, f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
            cut_off(port)
        want = lines(tmp_path / "nginx", 4)
        got = lines(tmp_path / "gannet", 4)
    assert got == want
    assert got == ["GET /big.bin 200 []", "GET /none 404 [OK]", "GET /small.txt 200 [OK]",
                   "HEAD /small.txt 200 [OK]"], got
