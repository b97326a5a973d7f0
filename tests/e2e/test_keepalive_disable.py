"""Keep-alive per browser and per location, on gannet and Debian's nginx with one config:
`keepalive_disable` (default msie6: an MSIE 4-6 POST closes the connection; `safari`;
`none`; an internal redirect also applies the server's), the idle wait after an answer being its location's `keepalive_timeout` rather than
the server's, and `$connection_time`.
"""

from __future__ import annotations

import re
import socket
import time

import pytest

from nginx_peer import NGINX, PEER_MAIN, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        keepalive_timeout 1;
        add_header X-Conn-Time $connection_time;
        location / { }
        location /safari { keepalive_disable safari; }
        location /none { keepalive_disable none; }
        location /both { keepalive_disable NONE msie6; keepalive_disable Safari; }
        location /long { keepalive_timeout 30s; }
    }
}
"""

MSIE5 = "Mozilla/4.0 (compatible; MSIE 5.0; Windows 98)"
MSIE7 = "Mozilla/4.0 (compatible; MSIE 7.0; Windows NT 6.0)"
SAFARI = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_7) AppleWebKit/534 Safari/7534.48.3"


def one(s: socket.socket, method: str, path: str, ua: str) -> str:
    """Send one request on a kept connection and read its answer's head (bodies are empty)."""
    body = "Content-Length: 0\r\n" if method == "POST" else ""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {ua}\r\n{body}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(4096)
        if not b:
            break
        head += b
    return head.decode("latin-1")


def connection(port: int, method: str, path: str, ua: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        m = re.search(r"\r\nConnection: (\S+)", one(s, method, path, ua))
        return m.group(1) if m else ""


CASES = [("POST", "/", MSIE5), ("GET", "/", MSIE5), ("POST", "/", MSIE7), ("GET", "/", SAFARI),
         ("GET", "/safari/", SAFARI), ("POST", "/none/", MSIE5), ("POST", "/both/", MSIE5),
         ("GET", "/both/", SAFARI), ("GET", "/both/", MSIE7), ("POST", "/none/index.html", MSIE5)]  # fmt: skip


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_keepalive_disable_as_nginx(tmp_path):
    files = {"index.html": "", "safari/index.html": "", "none/index.html": "", "both/index.html": "",
             "long/index.html": ""}  # fmt: skip
    with side_by_side(tmp_path, CONF, files) as (srv, nginx_port):
        got = {c: connection(srv.port, *c) for c in CASES}
        want = {c: connection(nginx_port, *c) for c in CASES}
    assert got == want
    assert got[("POST", "/", MSIE5)] == "close" and got[("GET", "/", MSIE5)] == "keep-alive"
    assert got[("GET", "/safari/", SAFARI)] == "close"
    assert got[("POST", "/none/index.html", MSIE5)] == "keep-alive"
    # The index's internal redirect passes through the server's settings (msie6), as nginx's.
    assert got[("POST", "/none/", MSIE5)] == "close"


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_idle_wait_is_the_locations_keepalive_timeout(tmp_path):
    """The server says 1s, /long says 30s: after an answer from /long the connection must
    still be there once the server's second has passed. `$connection_time` grows with it."""
    with side_by_side(tmp_path, CONF, {"long/index.html": ""}) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                first = one(s, "GET", "/long/", "t")
                assert re.search(r"X-Conn-Time: 0\.\d{3}\r\n", first), first
                # Outlast the server-level keepalive_timeout: what is being tested is a timeout.
                time.sleep(1.5)
                second = one(s, "GET", "/long/", "t")
                assert second.startswith("HTTP/1.1 200"), (port, second)
                t = float(re.search(r"X-Conn-Time: (\d+\.\d{3})\r\n", second).group(1))
                assert 1.5 <= t < 5, (port, t)
