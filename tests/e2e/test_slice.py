"""The slice module (`slice`, `$slice_range`) compared with Debian's nginx on one config:
both proxy to one application serving a 10000-byte file with byte ranges (`rangeapp`),
which records the Range of every request each server sent. For each step the client's
answer (status, Content-Range, Content-Length, body) and the ranges the upstream was
asked for must be the same: a full download made of 4k slices, client ranges within and
across slices, slices cached each on its own (a second download is all hits, a range in
the middle fetches its slice only), an upstream that ignores Range, and one that stops
answering 206 or changes its ETag half-way (the answer is cut short)."""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side
from rangeapp import DATA, SIZE, RangeApp

CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=cache:1m;
    server {
        listen 127.0.0.1:{port};
        location / {
            slice 4k;
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache cache;
            proxy_cache_key $uri$is_args$args$slice_range;
            proxy_set_header Range $slice_range;
            proxy_set_header X-Who $server_port;
            proxy_cache_valid 200 206 1h;
        }
        location /plain/ {
            slice 4k;
            proxy_pass http://127.0.0.1:@UP@/;
            proxy_set_header Range $slice_range;
            proxy_set_header X-Who $server_port;
        }
        location /unused/ {
            slice 4k;
            proxy_pass http://127.0.0.1:@UP@/;
            proxy_set_header X-Who $server_port;
        }
    }
}
"""


@pytest.fixture
def app():
    a = RangeApp()
    yield a
    a.stop()


def fetch(port: int, path: str, headers: str = "") -> tuple:
    """One request; the answer read to the connection's end (a cut one stays short)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    if not data:
        return ("closed",)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    h = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    assert "chunked" not in h.get("transfer-encoding", ""), "answers here have a length"
    # Error pages name their server: not a difference.
    body = re.sub(rb"<center>(nginx|gannet)/?[^<]*</center>", b"<center>SERVER</center>", body)
    # So do multipart boundaries.
    if m := re.search(r"boundary=(\S+)", h.get("content-type", "")):
        body = body.replace(m.group(1).encode(), b"BOUNDARY")
    return (
        int(lines[0].split()[1]),
        h.get("content-range"),
        h.get("content-length"),
        h.get("accept-ranges"),
        len(body),
        hashlib.md5(body).hexdigest(),
    )


STEPS = [
    ("/f1", ""),
    ("/f1", ""),
    ("/f1", "Range: bytes=5000-5099\r\n"),
    ("/f2", "Range: bytes=5000-5099\r\n"),
    ("/f2", "Range: bytes=4000-8500\r\n"),
    ("/f3", "Range: bytes=-100\r\n"),
    ("/f3", "Range: bytes=9000-\r\n"),
    ("/f4", "Range: bytes=0-1,5000-5001\r\n"),
    ("/f5", "Range: bytes=20000-\r\n"),
    ("/f6", 'Range: bytes=100-199\r\nIf-Range: "v1"\r\n'),
    ("/f6", 'Range: bytes=100-199\r\nIf-Range: "other"\r\n'),
    ("/plain/p", ""),
    ("/plain/p", "Range: bytes=8000-8191\r\n"),
    ("/norange/a", ""),
    ("/plain/norange/b", "Range: bytes=10-19\r\n"),
    ("/unused/u", "Range: bytes=10-19\r\n"),
]


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_slices_match_nginx(tmp_path, app):
    conf = CONF.replace("@UP@", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for path, headers in STEPS:
            got = {}
            for port in (srv.port, nginx_port):
                app.clear()
                got[port] = (fetch(port, path, headers), app.ranges(str(port)))
            assert got[srv.port] == got[nginx_port], (path, headers)
        # What nginx and gannet agreed on is what the slices are for.
        app.clear()
        assert fetch(srv.port, "/s") == (200, None, str(SIZE), "bytes", SIZE, hashlib.md5(DATA).hexdigest())
        assert app.ranges(str(srv.port)) == [("/s", "bytes=0-4095"), ("/s", "bytes=4096-8191"), ("/s", "bytes=8192-12287")]
        app.clear()
        fetch(srv.port, "/s")
        fetch(srv.port, "/s", "Range: bytes=5000-5099\r\n")
        assert app.ranges(str(srv.port)) == [], "cached slices are served from the cache"
        app.clear()
        part = fetch(srv.port, "/t", "Range: bytes=5000-5099\r\n")
        assert part[:3] == (206, f"bytes 5000-5099/{SIZE}", "100")
        assert part[5] == hashlib.md5(DATA[5000:5100]).hexdigest()
        assert app.ranges(str(srv.port)) == [("/t", "bytes=4096-8191")]


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
@pytest.mark.parametrize(
    "path, message",
    [
        ("/plain/no206/x", "unexpected status code 200 in slice response"),
        ("/plain/etag/x", "etag mismatch in slice response"),
    ],
)
def test_a_broken_slice_cuts_the_answer_as_nginx(tmp_path, app, path, message):
    conf = CONF.replace("@UP@", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        mine, theirs = fetch(srv.port, path), fetch(nginx_port, path)
        assert mine == theirs
        # The head and the first slice went out; the answer stops there.
        assert mine[:3] == (200, None, str(SIZE)) and mine[4] == 4096
        assert wait_until(lambda: message in srv.error_log())


def test_http2_clients_get_the_same_slices(gannet, app):
    """HTTP/2 goes through the same slice code: a whole answer and a range across slices."""
    conf = CONF.replace("@UP@", str(app.port)).replace("listen 127.0.0.1:{port};", "listen 127.0.0.1:{port} http2;")
    srv = gannet.start(conf=conf)

    def h2(path: str, *args: str) -> bytes:
        r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", *args, f"http://127.0.0.1:{srv.port}{path}"], capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert h2("/plain/h") == DATA
    assert h2("/plain/h", "-r", "4000-8500") == DATA[4000:8501]
    assert [r for _, r in app.ranges(str(srv.port))] == ["bytes=0-4095", "bytes=4096-8191", "bytes=8192-12287", "bytes=0-4095", "bytes=4096-8191", "bytes=8192-12287"]
