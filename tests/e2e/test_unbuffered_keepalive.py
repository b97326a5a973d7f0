"""`proxy_buffering off` with an upstream keepalive pool: an answer that has all come with
its head (a HEAD's, a 304's) leaves its connection for the next request, as nginx; the
upstream counts the connections it got. Compared with Debian's nginx."""

import pytest

import rawapps
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")


def answer(conn, head, _body):
    if b"/304" in head.split(b"\r\n", 1)[0]:
        conn.sendall(b"HTTP/1.1 304 Not Modified\r\n\r\n")
    else:
        # A HEAD's answer: the length of a body not sent.
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 26\r\n\r\n")
    return "again"


def connections_for(port: int, app: rawapps.HttpApp, method: str, path: str) -> int:
    before = app.accepted
    for _ in range(3):
        a = exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert a.status in (200, 304)
    return app.accepted - before


def test_bodyless_unbuffered_answers_keep_the_upstream_connection(tmp_path):
    app = rawapps.HttpApp(answer)
    conf = PEER_MAIN + """
http {
    access_log off;
    upstream backend { server 127.0.0.1:%d; keepalive 4; }
    server {
        listen 127.0.0.1:{port};
        location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
                     proxy_buffering off; }
    }
}
""" % app.port
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            # Three HEADs, then three 304s: all on the first connection.
            got = connections_for(port, app, "HEAD", "/head") + connections_for(port, app, "GET", "/304")
            assert got == 1, (port == srv.port, got)
