"""`auth_delay` on gannet and Debian's nginx with one config: a 401 from `auth_basic` (or
`auth_request`) is answered only once the delay has passed; a request let in, and a 403
from the rules, are not delayed.
"""

from __future__ import annotations

import time

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        location / {
            auth_delay 700ms;
            auth_basic "closed";
            auth_basic_user_file {root}/htpasswd;
        }
        location /deny/ { auth_delay 700ms; deny all; }
        location /ar/ { auth_delay 700ms; auth_request /no; }
        location = /no { return 401; }
    }
}
"""


def timed(port: int, path: str, auth: str = "") -> tuple[int, float]:
    head = f"Authorization: Basic {auth}\r\n" if auth else ""
    t0 = time.monotonic()
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n{head}Connection: close\r\n\r\n".encode())
    return a.status, time.monotonic() - t0


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_auth_delay_as_nginx(tmp_path):
    import base64

    good, bad = (base64.b64encode(x).decode() for x in (b"user:good", b"user:bad"))
    files = {"index.html": "hi", "deny/index.html": "", "ar/index.html": "", "htpasswd": "user:{PLAIN}good\n"}
    with side_by_side(tmp_path, CONF, files) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            status, t = timed(port, "/", bad)
            assert status == 401 and t >= 0.7, (port, status, t)
            status, t = timed(port, "/ar/")
            assert status == 401 and t >= 0.7, (port, status, t)
            status, t = timed(port, "/", good)
            assert status == 200 and t < 0.5, (port, status, t)
            status, t = timed(port, "/deny/")
            assert status == 403 and t < 0.5, (port, status, t)
