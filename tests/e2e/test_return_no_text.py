"""`return CODE;` without text for a code under 400 (not a redirect) is nginx's
ngx_http_send_response with an empty body, not the built-in page; under an `error_page` the
page's status stands (405 here) with that empty body. Compared with Debian's nginx."""

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")

CONF = PEER_MAIN + """
http {
    access_log off;
    default_type text/plain;
    server {
        listen 127.0.0.1:{port};
        location /r200 { return 200; }
        location /r204 { return 204; }
        location /r206 { return 206; }
        location /r304 { return 304; }
        location /r399 { return 399; }
        location /e204 { error_page 405 /r204; return 405; }
        location /e200 { error_page 405 /r200; return 405; }
    }
}
"""

PATHS = ["/r200", "/r204", "/r206", "/r304", "/r399", "/e204", "/e200"]


def head_and_body(port: int, path: str) -> tuple[str, bytes]:
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    head, _, body = a.raw.partition(b"\r\n\r\n")
    lines = [ln for ln in head.decode("latin-1").split("\r\n") if not ln.startswith(("Date:", "Server:"))]
    return "\n".join(lines), body


def test_return_without_text_matches_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for path in PATHS:
            assert head_and_body(srv.port, path) == head_and_body(nginx_port, path), path
        head, body = head_and_body(srv.port, "/e200")
        assert head.startswith("HTTP/1.1 405 ") and "Content-Length: 0" in head and body == b""
