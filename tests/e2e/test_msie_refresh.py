"""`msie_refresh`: a redirect the server makes itself (`return 301`, an `error_page` to a
URL) is sent to an MSIE client as a page that refreshes to it, its URL escaped; other
clients, and locations with it off, get the redirect. Compared with Debian's nginx."""

from __future__ import annotations

import pytest

from nginx_peer import PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        msie_refresh on;
        location / { return 301 text; }
        location /space { return 302 "to a place"; }
        location /page { return 301; error_page 301 there; }
        location /off { msie_refresh off; return 301 text; }
    }
}
"""


def get(port: int, path: str, ua: str):
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nUser-Agent: {ua}\r\n\r\n".encode())


@pytest.fixture
def both(tmp_path):
    with side_by_side(tmp_path, CONF) as servers:
        yield servers


@pytest.mark.parametrize("path", ["/", "/space", "/page", "/off"])
@pytest.mark.parametrize("ua", ["Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)", "curl/8"])
def test_refresh_as_nginx(both, path, ua):
    srv, nginx_port = both
    ours, theirs = get(srv.port, path, ua), get(nginx_port, path, ua)
    assert ours.status == theirs.status
    assert ours.headers.get("location") == theirs.headers.get("location")
    if ours.status == 200:
        assert ours.body == theirs.body
        assert b'http-equiv="Refresh"' in ours.body
    else:
        assert ours.status in (301, 302)
