"""`$upstream_response_length`, `$upstream_bytes_received` and `$upstream_bytes_sent`, on
gannet and Debian's nginx with one config and one application: the body's length, the
bytes read (head and body) and the request head's length as the application received it,
for a small answer, a large one in many reads, buffered and not; and as a trailer.
"""

from __future__ import annotations

import pytest

import rawapps
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

SMALL = b"TEST-OK-IF-YOU-SEE-THIS"
BIG = b"0123456789" * 20000


def behave(conn, head, body):
    data = BIG if b"big " in head.split(b"\r\n")[0] else SMALL
    answer = f"HTTP/1.1 200 OK\r\nConnection: close\r\nX-Len: {len(head) + 4}\r\n\r\n".encode()
    conn.sendall(answer + data)


@pytest.fixture
def app():
    yield from rawapps.made(rawapps.HttpApp)


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_upstream_byte_counts_as_nginx(tmp_path, app):
    up = app(behave)
    conf = PEER_MAIN + r"""
http {
    log_format u "$uri $upstream_response_length $upstream_bytes_received $upstream_bytes_sent $upstream_http_x_len";
    server {
        listen 127.0.0.1:{port};
        access_log {tmp}/u.log u;
        location / { proxy_pass http://127.0.0.1:%d; }
        location /nb/ { proxy_pass http://127.0.0.1:%d; proxy_buffering off; }
        location /tr/ {
            proxy_pass http://127.0.0.1:%d;
            add_trailer X-Length $upstream_response_length;
        }
    }
}
""" % (up.port, up.port, up.port)
    paths = ["/small", "/big", "/nb/small", "/nb/big"]
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            for p in paths:
                a = exchange(port, f"GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                assert a.body == (BIG if p.endswith("big") else SMALL)
            t = exchange(port, b"GET /tr/big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert t.raw.split(b"\r\n0\r\n")[-1] == f"X-Length: {len(BIG)}\r\n\r\n".encode(), t.raw[-80:]
        logs = {}
        for side in ("gannet", "nginx"):
            f = tmp_path / side / "u.log"
            assert wait_until(lambda: f.exists() and f.read_text().count("\n") == 5)
            logs[side] = [line.split() for line in f.read_text().splitlines()]
    for side, rows in logs.items():
        for uri, length, received, sent, x_len in rows[:4]:
            body = len(BIG if uri.endswith("big") else SMALL)
            head = len(f"HTTP/1.1 200 OK\r\nConnection: close\r\nX-Len: {x_len}\r\n\r\n")
            assert (int(length), int(received), sent) == (body, head + body, x_len), (side, uri)
