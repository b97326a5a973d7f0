"""`expires modified` on a proxied answer counts from the application's Last-Modified (nginx
parses it into last_modified_time), not from now; compared with Debian's nginx."""

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")

CONF = PEER_MAIN + """
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location /old { expires modified 2048; proxy_pass http://127.0.0.1:{port}/back/old; }
        location /new { expires modified 1h; proxy_pass http://127.0.0.1:{port}/back/new; }
        location /back/old { add_header Last-Modified "Mon, 28 Sep 1970 06:00:00 GMT"; return 200 "x"; }
        location /back/new { add_header Last-Modified "Thu, 31 Dec 2099 23:00:00 GMT"; return 200 "x"; }
    }
}
"""


def expiry(port: int, path: str) -> tuple[str | None, str | None]:
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    return a.headers.get("expires"), a.headers.get("cache-control")


def test_expires_modified_counts_from_the_proxied_last_modified(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for path in ("/old", "/new"):
            assert expiry(srv.port, path)[0] == expiry(nginx_port, path)[0], path
        assert expiry(srv.port, "/old") == ("Mon, 28 Sep 1970 06:34:08 GMT", "no-cache")
        assert expiry(srv.port, "/new")[0] == "Fri, 01 Jan 2100 00:00:00 GMT"
