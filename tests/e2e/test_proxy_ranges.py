"""Byte ranges of proxied answers compared with Debian's nginx on one config
(`proxy_force_ranges`, `proxy_cache_max_range_offset`, ranges of cached entries), with an
upstream (`rangeapp`) that records the Range of every request each server sent: without
`proxy_force_ranges` an answer that ignored the client's Range goes whole; with it, one
range is cut from it (several get the whole, as nginx's single range); an answer being
cached is cut by the server (the Range is not passed), unless the range starts at or
past `proxy_cache_max_range_offset`, when it goes to the upstream and is not stored."""

from __future__ import annotations

import socket

import pytest

from nginx_peer import NGINX, PEER_MAIN, side_by_side
from rangeapp import RangeApp
from test_slice import fetch

CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=cache:1m;
    proxy_set_header X-Who $server_port;
    add_header X-Cache $upstream_cache_status;
    server {
        listen 127.0.0.1:{port};
        location /plain/ {
            proxy_pass http://127.0.0.1:@UP@/;
        }
        location /forced/ {
            proxy_pass http://127.0.0.1:@UP@/;
            proxy_force_ranges on;
        }
        location /cached/ {
            proxy_pass http://127.0.0.1:@UP@/;
            proxy_cache cache;
            proxy_cache_valid 200 1h;
            proxy_cache_max_range_offset 5000;
        }
        location /zero/ {
            proxy_pass http://127.0.0.1:@UP@/;
            proxy_cache cache;
            proxy_cache_valid 200 1h;
            proxy_cache_max_range_offset 0;
        }
    }
}
"""

STEPS = [
    ("/plain/noar/norange/a", "Range: bytes=10-19\r\n"),
    ("/plain/a", "Range: bytes=10-19\r\n"),
    ("/forced/noar/norange/a", "Range: bytes=10-19\r\n"),
    ("/forced/noar/norange/a", "Range: bytes=9990-\r\n"),
    ("/forced/noar/norange/a", "Range: bytes=0-1,5-6\r\n"),
    ("/forced/noar/norange/a", "Range: bytes=20000-\r\n"),
    ("/forced/noar/norange/a", 'Range: bytes=10-19\r\nIf-Range: "v1"\r\n'),
    ("/forced/noar/norange/a", 'Range: bytes=10-19\r\nIf-Range: "v2"\r\n'),
    ("/forced/noar/norange/a", ""),
    ("/cached/m1", "Range: bytes=6000-6009\r\n"),
    ("/cached/m1", "Range: bytes=6000-6009\r\n"),
    ("/cached/m1", "Range: bytes=100-109\r\n"),
    ("/cached/m1", "Range: bytes=6000-6009\r\n"),
    ("/cached/m1", "Range: bytes=0-1,5-6\r\n"),
    ("/cached/m2", "Range: bytes=-100\r\n"),
    ("/cached/m2", "Range: bytes=4999-5000\r\n"),
    ("/cached/m2", "Range: bytes=-100\r\n"),
    ("/cached/norange/m3", "Range: bytes=10-19\r\n"),
    ("/cached/noar/m4", "Range: bytes=10-19\r\n"),
    ("/cached/noar/m4", "Range: bytes=10-19\r\n"),
    ("/zero/z", "Range: bytes=0-9\r\n"),
    ("/zero/z", ""),
    ("/zero/z", "Range: bytes=0-9\r\n"),
    # A large answer: cut as it streams by while it is stored, then ranges of the entry.
    ("/cached/big/b", "Range: bytes=100-199\r\n"),
    ("/cached/big/b", "Range: bytes=2500000-2500099\r\n"),
    ("/cached/big/b", "Range: bytes=2999990-\r\n"),
    ("/cached/big/b", "Range: bytes=0-1,2999998-2999999\r\n"),
    ("/cached/big/b", ""),
    ("/forced/noar/norange/big/f", "Range: bytes=1000000-1000099\r\n"),
]


@pytest.fixture
def app():
    a = RangeApp()
    yield a
    a.stop()


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_proxied_ranges_match_nginx(tmp_path, app):
    conf = CONF.replace("@UP@", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for path, headers in STEPS:
            got = {}
            for port in (srv.port, nginx_port):
                app.clear()
                got[port] = (fetch(port, path, headers), app.ranges(str(port)))
            assert got[srv.port] == got[nginx_port], (path, headers)
        # The steps did what they are for: a forced range is cut from a whole answer...
        app.clear()
        assert fetch(srv.port, "/forced/noar/norange/b", "Range: bytes=10-19\r\n")[:3] == (206, "bytes 10-19/10000", "10")
        assert app.ranges(str(srv.port)) == [("/noar/norange/b", "bytes=10-19")]
        # ...and a range past the offset is the upstream's, not stored.
        app.clear()
        assert fetch(srv.port, "/cached/c", "Range: bytes=7000-7009\r\n")[:2] == (206, "bytes 7000-7009/10000")
        assert fetch(srv.port, "/cached/c", "Range: bytes=7000-7009\r\n")[:2] == (206, "bytes 7000-7009/10000")
        assert app.ranges(str(srv.port)) == [("/c", "bytes=7000-7009")] * 2


def raw_get(port: int, path: str, rng: str) -> tuple[int, list[str], bytes]:
    """(status, every Content-Range line, body) of one request."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: a\r\nRange: {rng}\r\nConnection: close\r\n\r\n".encode())
        data = b"".join(iter(lambda: s.recv(65536), b""))
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    ranges = [v.strip() for n, _, v in (ln.partition(":") for ln in lines[1:]) if n.lower() == "content-range"]
    return int(lines[0].split()[1]), ranges, body


def test_upstream_content_range_gives_way(gannet):
    """An upstream's Content-Range on a 200 (meaningless there) gives way to the range
    filter's: one Content-Range on a 206, none beside a multipart answer's parts, the 416's
    own (nginx 1.23.1; Debian's 1.22 sends both)."""
    srv = gannet.start(conf="""
        events {}
        http {
            access_log off;
            proxy_cache_path {tmp}/cache keys_zone=c:1m;
            server {
                listen 127.0.0.1:{port};
                location /cached/ { proxy_pass http://127.0.0.1:{port}/stub; proxy_cache c; proxy_cache_valid 200 1m; }
                location /forced/ { proxy_pass http://127.0.0.1:{port}/stub; proxy_force_ranges on; }
                location /stub {
                    add_header Content-Range stub;
                    add_header Accept-Ranges bytes;
                    return 200 "SEE-THIS";
                }
            }
        }""")
    for path in ("/cached/", "/cached/", "/forced/"):
        assert raw_get(srv.port, path, "bytes=0-4") == (206, ["bytes 0-4/8"], b"SEE-T"), path
        assert raw_get(srv.port, path, "bytes=1000-")[:2] == (416, ["bytes */8"]), path
    status, ranges, body = raw_get(srv.port, "/cached/", "bytes=0-2,4-")
    assert status == 206 and ranges == [] and b"stub" not in body
    assert b"Content-Range: bytes 0-2/8" in body and b"Content-Range: bytes 4-7/8" in body
