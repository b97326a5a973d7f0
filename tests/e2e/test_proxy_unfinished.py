"""An upstream that closes before the end of the body it announced: the client still gets
the answer's head and what came of the body, and the answer is then cut short - chunked,
without the last chunk; with the announced length, short of it - as Debian's nginx does
with the same config (buffered and not). Such an answer is not cached. And
`sub_filter_types *` takes an answer without a Content-Type (its length goes: chunked)."""

from __future__ import annotations

import socket

import pytest

import rawapps
from nginx_peer import PEER_MAIN, side_by_side


def behave(conn, head, _body):
    path = head.split(b" ")[1]
    if path.endswith(b"/chunked"):
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nCache-Control: max-age=300\r\n\r\nff\r\nunfinished\r\n")
    else:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nCache-Control: max-age=300\r\n\r\nunfinished\r\n")


@pytest.fixture
def apps():
    yield from rawapps.made(rawapps.HttpApp)


CONF = PEER_MAIN + """
http {
    proxy_cache_path {tmp}/cache keys_zone=one:1m;
    server {
        listen 127.0.0.1:{port};
        location /buf/ { sub_filter foo bar; sub_filter_types *; proxy_pass http://127.0.0.1:APP; }
        location /un/ {
            sub_filter foo bar; sub_filter_types *;
            proxy_pass http://127.0.0.1:APP; proxy_buffering off;
        }
        location /plain/ { proxy_pass http://127.0.0.1:APP; }
        location /cache/ {
            proxy_pass http://127.0.0.1:APP;
            proxy_cache one;
            add_header X-Cache $upstream_cache_status;
        }
    }
}
"""


def raw_get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def shape(raw: bytes) -> tuple:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = {l.split(b":")[0].lower() for l in lines[1:]}
    return lines[0], b"transfer-encoding" in fields, b"content-length" in fields, body


@pytest.mark.parametrize("path", ["/buf/length", "/buf/chunked", "/un/length", "/un/chunked", "/plain/length"])
def test_cut_short_as_nginx(tmp_path, apps, path):
    app = apps(behave)
    with side_by_side(tmp_path, CONF.replace("APP", str(app.port))) as (srv, nginx_port):
        ours, theirs = shape(raw_get(srv.port, path)), shape(raw_get(nginx_port, path))
        # The same head and framing (nginx holds back a partial chunk's last byte: the
        # bodies may differ by it).
        assert ours[:3] == theirs[:3]
        assert ours[0] == b"HTTP/1.1 200 OK"
        for body in (ours[3], theirs[3]):
            assert b"unfinished" in body and not body.endswith(b"0\r\n\r\n")


def test_unfinished_answer_not_cached(tmp_path, apps):
    app = apps(behave)
    with side_by_side(tmp_path, CONF.replace("APP", str(app.port))) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            raw_get(port, "/cache/length")
            assert b"X-Cache: MISS" in raw_get(port, "/cache/length")
