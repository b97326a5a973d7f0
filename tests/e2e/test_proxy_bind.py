"""`proxy_bind` on gannet and Debian's nginx with one config: the server sees connections
from the address given (inherited, `off`, with variables, empty: none, not an address:
none), and nginx's errors for bad values.
"""

from __future__ import annotations

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        proxy_bind 127.0.0.2;
        location /own/ { proxy_bind 127.0.0.3; proxy_pass http://127.0.0.1:{port}/t; }
        location /inherit/ { proxy_pass http://127.0.0.1:{port}/t; }
        location /off/ { proxy_bind off; proxy_pass http://127.0.0.1:{port}/t; }
        location /var/ { proxy_bind $arg_b; proxy_pass http://127.0.0.1:{port}/t; }
        location = /t { return 200 "$remote_addr"; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_proxy_bind_as_nginx(tmp_path):
    paths = ["/own/", "/inherit/", "/off/", "/var/?b=127.0.0.4", "/var/?b=", "/var/?b=nonsense"]
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = [exchange(srv.port, f"GET {p} HTTP/1.0\r\n\r\n".encode()).body for p in paths]
        want = [exchange(nginx_port, f"GET {p} HTTP/1.0\r\n\r\n".encode()).body for p in paths]
    assert got == want
    assert got[:4] == [b"127.0.0.3", b"127.0.0.2", b"127.0.0.1", b"127.0.0.4"]
    assert got[4:] == [b"127.0.0.1", b"127.0.0.1"]


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_proxy_bind_errors_as_nginx(tmp_path):
    for bad in ("proxy_bind foo;", "proxy_bind 127.0.0.1 x;", "proxy_bind off transparent;",
                "proxy_bind 127.0.0.1; proxy_bind off;"):
        n, g = check_both(tmp_path, bad)
        assert n.returncode != 0 and g.returncode != 0, (bad, n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr, (bad, n.stderr, g.stderr)
