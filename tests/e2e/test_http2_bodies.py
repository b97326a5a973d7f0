"""Request bodies as nginx takes them, against Debian's nginx where 1.22 has the behaviour:
the HTTP/2 connection's receive window opened at once (a WINDOW_UPDATE right after SETTINGS,
which clients such as nginx's own tests wait for); a stream announcing Content-Length 0 is
proxied unbuffered without waiting for its end; a body of unknown length (chunked) passed to FastCGI
as it comes with `fastcgi_request_buffering off`.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

import rawapps

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side
from test_http2 import PREFACE, frame, frames_until

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    server {
        listen 127.0.0.1:{port} http2;
        location / { proxy_pass http://127.0.0.1:APP; proxy_request_buffering off; }
    }
}
"""


def first_frames(port: int, extra: bytes = b"", want: int = 8) -> list[tuple[int, int, bytes]]:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(PREFACE + frame(4, 0, 0, b"") + extra)
        return frames_until(s, want, deadline=5)


@pytest.fixture
def app():
    a = rawapps.HttpApp(lambda conn, _head, _body: conn.sendall(rawapps.http_answer(b"app\n", keep=False)))
    yield a
    a.close()


def test_connection_window_opened_at_once_as_nginx(tmp_path, app):
    with side_by_side(tmp_path, CONF.replace("APP", str(app.port))) as (srv, nginx_port):
        got = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            frames = first_frames(port)
            updates = [struct.unpack(">I", p)[0] for kind, stream, p in frames if kind == 8 and stream == 0]
            got[name] = updates
    assert got["gannet"] == got["nginx"] == [(1 << 31) - 1 - 65535]


def test_content_length_zero_is_answered_before_the_stream_ends(tmp_path, app):
    # HEADERS without END_STREAM: GET /, content-length: 0 (literal, new name).
    headers = b"\x82\x86\x84\x01\x09localhost" + b"\x00\x0econtent-length\x010"
    with side_by_side(tmp_path, CONF.replace("APP", str(app.port))) as (srv, nginx_port):
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            frames = first_frames(port, frame(1, 0x4, 1, headers), want=0)
            data = [p for kind, stream, p in frames if kind == 0 and stream == 1]
            assert data == [b"app\n"], (name, frames)


FCGI = PEER_MAIN + r"""
http {
    server {
        listen 127.0.0.1:{port};
        location / {
            fastcgi_request_buffering off;
            fastcgi_pass 127.0.0.1:APP;
        }
    }
}
"""


class StdinWatcher:
    """A FastCGI application that records each STDIN record's payload as it comes, and
    answers once the empty one ends the body."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.stdin: list[bytes] = []
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while True:
                    while len(buf) < 8 or len(buf) < 8 + struct.unpack(">H", buf[4:6])[0] + buf[6]:
                        got = conn.recv(65536)
                        if not got:
                            break
                        buf += got
                    else:
                        kind, n, pad = buf[1], struct.unpack(">H", buf[4:6])[0], buf[6]
                        payload, buf = buf[8:8 + n], buf[8 + n + pad:]
                        if kind == 5:
                            self.stdin.append(payload)
                            if not payload:
                                out = b"Content-Type: text/plain\r\n\r\ndone\n"
                                conn.sendall(struct.pack(">BBHHBx", 1, 6, 1, len(out), 0) + out)
                                conn.sendall(struct.pack(">BBHHBx", 1, 3, 1, 8, 0) + bytes(8))
                                break
                        continue
                    break

    def close(self):
        self.sock.close()


def test_chunked_body_streams_to_fastcgi_as_nginx(tmp_path):
    app = StdinWatcher()
    try:
        with side_by_side(tmp_path, FCGI.replace("APP", str(app.port))) as (srv, nginx_port):
            for server, port in (("nginx", nginx_port), ("gannet", srv.port)):
                app.stdin.clear()
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                    # The first piece reaches the application before the body's end is sent.
                    assert wait_until(lambda: b"first" in b"".join(app.stdin)), server
                    s.sendall(b"4\r\nrest\r\n0\r\n\r\n")
                    answer = b""
                    while b"done" not in answer and (got := s.recv(65536)):
                        answer += got
                assert answer.startswith(b"HTTP/1.1 200") and b"done" in answer, (server, answer)
                assert b"".join(app.stdin) == b"firstrest", server
    finally:
        app.close()
