"""add_trailer: trailer fields after the last chunk of an HTTP/1.1 answer (which goes
chunked for them, as nginx's), only for the statuses nginx allows unless `always`,
inherited like add_header; and in a trailing HEADERS frame over HTTP/2. HTTP/1 answers are
compared raw with Debian's nginx's."""

import re
import shutil
import socket
import subprocess

import pytest

from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, side_by_side

LOCATIONS = """
        add_trailer X-Server-Level "s";
        location /file { add_trailer X-Status "$status"; add_trailer X-Bad "b" always; }
        location /missing { add_trailer X-Gone "no"; add_trailer X-Always "yes" always; }
        location /inherit { }
        location /empty { add_trailer X-Empty ""; }
        location /ret { add_trailer X-Ret "r"; return 200 "short"; }
"""

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
%s
    }
}
""" % LOCATIONS

FILES = {"file.txt": "hello trailers\n", "inherit": "inherited\n", "empty": "e\n"}


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        out = b""
        while b := s.recv(65536):
            out += b
    return out


def normalise(answer: bytes) -> bytes:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = [l for l in head.split(b"\r\n")[1:] if not l.lower().startswith((b"server:", b"date:", b"etag:", b"last-modified:", b"accept-ranges:"))]
    body = re.sub(rb"gannet/[\d.]+|nginx/[\d.]+", b"SERVER", body)
    return head.split(b"\r\n")[0] + b"\r\n" + b"\r\n".join(sorted(lines)) + b"\r\n\r\n" + body


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_trailers_match_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, files=FILES) as (srv, nginx_port):
        for method, path, version in (("GET", "/file.txt", "1.1"), ("GET", "/missing", "1.1"), ("GET", "/inherit", "1.1"),
                                      ("GET", "/empty", "1.1"), ("GET", "/ret", "1.1"), ("GET", "/file.txt", "1.0"),
                                      ("HEAD", "/file.txt", "1.1")):
            req = f"{method} {path} HTTP/{version}\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
            ours, theirs = raw(srv.port, req), raw(nginx_port, req)
            assert normalise(ours) == normalise(theirs), (method, path, version)
        ours = raw(srv.port, b"GET /file.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        # Chunked instead of the file's length, the fields after the last chunk.
        assert b"Transfer-Encoding: chunked" in ours and b"Content-Length" not in ours
        assert ours.endswith(b"\r\n0\r\nX-Status: 200\r\nX-Bad: b\r\n\r\n")
        # curl reads them as trailers.
        out = subprocess.run(["curl", "-s", "--raw", f"http://127.0.0.1:{srv.port}/missing"], capture_output=True, timeout=10).stdout
        assert out.endswith(b"0\r\nX-Always: yes\r\n\r\n") and b"X-Gone" not in out


@pytest.mark.skipif(shutil.which("nghttp") is None, reason="needs nghttp2-client")
def test_trailers_over_http2(gannet):
    h2 = free_port()
    srv = gannet.start(server=LOCATIONS.replace("add_trailer X-Server-Level", "listen 127.0.0.1:%d http2;\n        add_trailer X-Server-Level" % h2),
                       files=FILES)
    out = subprocess.run(["nghttp", "-v", f"http://127.0.0.1:{h2}/file.txt"], capture_output=True, text=True, timeout=10).stdout
    # The body, then a HEADERS frame ending the stream with the fields (nghttp prints
    # the fields, then the frame).
    data = out.index("recv DATA frame")
    trailers = out.index("recv HEADERS frame", data)
    assert "flags=0x05" in out[trailers:].split("\n")[0]
    assert "x-status: 200" in out[data:trailers] and "x-bad: b" in out[data:trailers]
    out = subprocess.run(["nghttp", "-v", f"http://127.0.0.1:{h2}/missing"], capture_output=True, text=True, timeout=10).stdout
    tail = out[out.index(":status: 404"):]
    assert "x-always: yes" in tail and "x-gone" not in tail
    # Level inherited: the server's trailer on a location with none of its own.
    out = subprocess.run(["nghttp", "-v", f"http://127.0.0.1:{h2}/inherit"], capture_output=True, text=True, timeout=10).stdout
    assert "x-server-level: s" in out
    assert srv.get("/inherit")[2] == b"inherited\n"
