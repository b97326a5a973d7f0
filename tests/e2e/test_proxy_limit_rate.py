"""`proxy_limit_rate` on gannet and Debian's nginx with one config: an answer of 60,000
bytes read from the server at 20,000 bytes a second (the first second's worth at once, as
nginx's pipe allows) takes two seconds or more; an answer not buffered is not limited (as
nginx's), nor one under `proxy_limit_rate 0`.
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
        proxy_limit_rate 20000;
        proxy_buffer_size 4k;
        location / { proxy_pass http://127.0.0.1:{port}/data/; }
        location /nb/ { proxy_pass http://127.0.0.1:{port}/data/; proxy_buffering off; }
        location /free/ { proxy_pass http://127.0.0.1:{port}/data/; proxy_limit_rate 0; }
        location /data/ { }
    }
}
"""

DATA = "X" * 60000


def timed(port: int, path: str) -> tuple[int, float]:
    t0 = time.monotonic()
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), timeout=10)
    assert a.body == DATA.encode(), (port, path, len(a.body))
    return a.status, time.monotonic() - t0


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_proxy_limit_rate_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, {"data/f": DATA}) as (srv, nginx_port):
        for port in (nginx_port, srv.port):
            status, t = timed(port, "/f")
            assert status == 200 and 1.9 <= t < 4, (port, t)
            # Not buffered, or `0`: not limited.
            for path in ("/nb/f", "/free/f"):
                status, t = timed(port, path)
                assert status == 200 and t < 0.5, (port, path, t)
