"""A request that sends `Connection: close` upstream (`proxy_set_header Connection ...`)
through a group with `keepalive`: as nginx's keepalive balancer, it takes the kept
connection (which then closes with it) instead of opening one of its own and leaving the
kept one in the pool. Checked side by side with Debian's nginx by the upstream's
`$connection` numbers: the same for the first three requests, a new one after the close.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange_from, parse, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    access_log off;
    upstream u { server unix:{tmp}/up.sock; keepalive 1; }
    server {
        listen unix:{tmp}/up.sock;
        location / { return 200 "conn=$connection\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        proxy_http_version 1.1;
        location / { proxy_pass http://u; proxy_set_header Connection $args; }
    }
}
"""


def upstream_conns(port: int) -> list[bytes]:
    out = []
    for path in ("/", "/", "/?close", "/"):
        raw, _ = exchange_from(port, f"GET {path} HTTP/1.0\r\nHost: a\r\n\r\n".encode(), "127.0.0.1")
        out.append(parse(raw).body)
    return out


def test_close_takes_the_kept_connection(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            a, b, c, d = upstream_conns(port)
            assert a.startswith(b"conn=") and a == b == c != d, (port, a, b, c, d)
