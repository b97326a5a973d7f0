"""The host of an absolute-form request target is checked as the Host header is (nginx's
ngx_http_validate_host): one trailing dot dropped, `..` and a bare dot refused with 400;
on gannet and Debian's nginx with one config.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server { listen 127.0.0.1:{port}; return 200 "$host"; }
}
"""

TARGETS = ["http://www.Example.com./", "http://example.com.:8080/", "http://./", "http://a..b/",
           "http://[::1]/", "http://[::..1]/", "http://example.com/"]  # fmt: skip


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_absolute_host_as_nginx(tmp_path):
    def ask(port, t):
        a = exchange(port, f"GET {t} HTTP/1.0\r\n\r\n".encode())
        return a.status, a.body if a.status == 200 else b""

    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = {t: ask(srv.port, t) for t in TARGETS}
        want = {t: ask(nginx_port, t) for t in TARGETS}
    assert got == want
    assert got["http://www.Example.com./"] == (200, b"www.example.com")
    assert got["http://a..b/"][0] == got["http://./"][0] == 400
