"""`max_headers` (the most header fields a request may have) on gannet and Debian's nginx
with one config, and `connection_pool_size` / `request_pool_size`, which size memory
pools gannet does not have: accepted with nginx's checks and messages.
"""

from __future__ import annotations

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    connection_pool_size 512;
    request_pool_size 4k;
    server {
        listen 127.0.0.1:{port};
        max_headers 5;
        location / { return 200 "ok"; }
    }
}
"""


def ask(port: int, fields: int) -> int:
    extra = "".join(f"X-Blah: {i}\r\n" for i in range(fields - 1))
    return exchange(port, f"GET / HTTP/1.0\r\nHost: x\r\n{extra}\r\n".encode()).status


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_max_headers_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = [ask(srv.port, n) for n in (5, 6, 40)]
        want = [ask(nginx_port, n) for n in (5, 6, 40)]
    assert got[0] == want[0] == 200
    # nginx's own 494, answered "400 Request Header Or Cookie Too Large".
    assert want[1:] == got[1:] == [400, 400]


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_pool_sizes_checked_as_nginx(tmp_path):
    for bad in ("connection_pool_size 96;", "request_pool_size 120;", "request_pool_size 0;",
                "connection_pool_size 1x;", "max_headers x;", "max_headers 1; max_headers 2;"):
        n, g = check_both(tmp_path, bad)
        assert n.returncode != 0 and g.returncode != 0, (bad, n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr, (bad, n.stderr, g.stderr)
    n, g = check_both(tmp_path, "connection_pool_size 112; request_pool_size 8k; max_headers 0;")
    assert n.returncode == 0 and g.returncode == 0, (n.stderr, g.stderr)
