"""`flv;` against Debian's nginx on the same config and files: `?start=N` answers with an FLV
header and the file from byte N (small files from memory and large ones from disk), and
whole files for no, zero, bad or too large offsets; ranges and conditional requests over
the result; the ETag of the shortened answer; other methods, directories and missing files."""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")

CONF = PEER_MAIN + """
http {
    types { video/x-flv flv; }
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /v/ { flv; }
        location /plain/ { }
    }
}
"""

SMALL = bytes(range(256)) * 4
# Past the size gannet keeps in memory: sent from the file.
LARGE = bytes((i * 7) % 251 for i in range(3 * 1024 * 1024 + 17))

FILES = {"v/s.flv": SMALL, "v/l.flv": LARGE, "v/dir/x": b"x", "plain/s.flv": SMALL}

COMPARED = ("content-type", "content-length", "etag", "last-modified", "content-range", "accept-ranges")


def get(path: str, extra: str = "", method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode()


CASES = [
    get("/v/s.flv"),
    get("/v/s.flv?start=100"),
    get("/v/s.flv?a=1&START=1023"),
    get("/v/s.flv?start=0"),
    get("/v/s.flv?start=1024"),
    get("/v/s.flv?start=-5"),
    get("/v/s.flv?start=12x"),
    get("/v/s.flv?start="),
    get("/v/l.flv?start=1000000"),
    get("/v/s.flv?start=100", "Range: bytes=0-20\r\n"),
    get("/v/l.flv?start=77", "Range: bytes=-40\r\n"),
    get("/v/s.flv?start=100", method="HEAD"),
    get("/v/s.flv?start=100", method="POST"),
    get("/v/dir"),
    get("/v/nothing.flv?start=3"),
    get("/plain/s.flv?start=100"),
]


def test_flv_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        seen = []
        for req in CASES:
            ours, theirs = exchange(srv.port, req), exchange(nginx_port, req)
            line = req.split(b"\r\n")[0]
            assert ours.status == theirs.status, line
            seen.append(ours.status)
            for h in COMPARED:
                assert ours.headers.get(h) == theirs.headers.get(h), (line, h)
            if ours.status in (200, 206):
                assert ours.body == theirs.body, line
        assert seen == [200, 200, 200, 200, 200, 200, 200, 200, 200, 206, 206, 200, 405, 301, 404, 200]
        hit = exchange(srv.port, CASES[1])
        assert hit.body == b"FLV\x01\x05\0\0\0\x09\0\0\0\0" + SMALL[100:]
        big = exchange(srv.port, CASES[8])
        assert big.body[13:] == LARGE[1000000:]
        # Several ranges across the header and the file: nginx 1.22 logs "range in
        # overlapped buffers" and drops the connection; gannet answers them.
        multi = exchange(srv.port, get("/v/s.flv?start=100", "Range: bytes=5-9,900-\r\n"))
        assert multi.status == 206
        whole = b"FLV\x01\x05\0\0\0\x09\0\0\0\0" + SMALL[100:]
        assert f"Content-Range: bytes 5-9/{len(whole)}".encode() + b"\r\n\r\n" + whole[5:10] in multi.body
        assert f"Content-Range: bytes 900-{len(whole) - 1}/{len(whole)}".encode() + b"\r\n\r\n" + whole[900:] in multi.body


def test_flv_only_in_location(tmp_path):
    n, g = check_both(tmp_path, "server { listen 127.0.0.1:2; flv; }")
    assert n.returncode != 0 and g.returncode != 0
    assert '"flv" directive is not allowed here' in n.stderr and '"flv" directive is not allowed here' in g.stderr
    n, g = check_both(tmp_path, "server { listen 127.0.0.1:2; location / { flv on; } }")
    assert n.returncode != 0 and g.returncode != 0
    assert 'invalid number of arguments in "flv" directive' in n.stderr
    assert 'invalid number of arguments in "flv" directive' in g.stderr
