"""Method bytes as nginx takes them (ngx_http_parse_request_line): upper-case letters, `_`
and `-`; any other byte is a 400, answered as soon as it arrives, before the request line
is complete (nginx-tests' h2.t sends 16 `x` bytes to a cleartext port and waits for the 400).
Side by side with Debian's nginx."""

from __future__ import annotations

import socket

import pytest

from nginx_peer import NGINX, PEER_MAIN, parse, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location / { return 200 "$request_method\n"; }
    }
}
"""


def status(port: int, data: bytes) -> int:
    """The status of what `data` gets with the connection left open (0: nothing in 5 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        try:
            while b"\r\n\r\n" not in got and (chunk := s.recv(4096)):
                got += chunk
        except socket.timeout:
            return 0
    return parse(got).status


def test_method_bytes_as_nginx(tmp_path):
    whole = {m: f"{m} / HTTP/1.1\r\nHost: x\r\n\r\n".encode() for m in ("get", "G1T", "G_T", "M-SEARCH", "GET")}
    partial = [b"x" * 16, b"get", b"G1", b"GET\r\n"]
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            got = {m: status(port, d) for m, d in whole.items()}
            assert got == {"get": 400, "G1T": 400, "G_T": 200, "M-SEARCH": 200, "GET": 200}, (port, got)
            assert [status(port, d) for d in partial] == [400] * len(partial), port
