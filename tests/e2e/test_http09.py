"""HTTP/0.9 simple requests (`GET /path` with no version), which nginx still serves: no
header fields are read, the answer is the body alone and the connection closes after it.
Compared byte for byte with Debian's nginx on one config, access log lines included; only
GET is served (another method is nginx's 400, "invalid method in HTTP/0.9 request").
"""

from __future__ import annotations

import re
import socket

import pytest

from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    log_format simple '$request|$status|$server_protocol|$body_bytes_sent';
    access_log {tmp}/access.log simple;
    gzip on;
    gzip_min_length 0;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /text { return 200 "protocol=[$server_protocol] host=[$host]\n"; }
        location /moved { return 301 /elsewhere; }
    }
}
"""

REQUESTS = [
    b"GET /index.html\r\n",
    b"GET /index.html\n",
    b"GET /text?x=1   \r\n",
    b"GET /missing\r\n",
    b"GET /moved\r\n",
    # Header lines after the line are not read: the answer is for the line alone.
    b"GET /text\r\nHost: other\r\n\r\n",
]


def exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        try:
            return b"".join(iter(lambda: s.recv(65536), b""))
        except ConnectionResetError:
            return b"<reset>"


def test_http09_as_nginx(tmp_path):
    files = {"index.html": "<p>zero nine</p>\n"}
    with side_by_side(tmp_path, CONF, files) as (srv, nginx_port):
        for req in REQUESTS:
            ours = exchange(srv.port, req)
            theirs = exchange(nginx_port, req)
            # Error pages name their server.
            norm = lambda b: re.sub(rb"<center>(nginx|gannet)[^<]*</center>", b"<center>S</center>", b)
            assert norm(ours) == norm(theirs), req
            assert not ours.startswith(b"HTTP/"), req
        assert exchange(srv.port, b"GET /index.html\r\n") == b"<p>zero nine</p>\n"
        assert exchange(srv.port, b"GET /text\r\n") == b"protocol=[] host=[]\n"
        # Another method: refused, as nginx does.
        for req in (b"HEAD /index.html\r\n", b"POST /text\r\n"):
            assert b"400 Bad Request" in exchange(srv.port, req)
            assert b"400 Bad Request" in exchange(nginx_port, req)
        srv.stop()
        ours = (srv.tmp / "access.log").read_text().splitlines()
        theirs = (tmp_path / "nginx" / "access.log").read_text().splitlines()
        assert ours[:len(REQUESTS)] == theirs[:len(REQUESTS)]
        assert ours[0] == "GET /index.html|200|-|17"
