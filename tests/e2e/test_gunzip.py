"""gunzip: gzip-encoded answers (gzip_static always files, and the same proxied) sent
inflated to clients that do not take gzip, passed as they are to those that do; headers
(Content-Encoding, Content-Length, Accept-Ranges, ETag, Vary) side by side with Debian's
nginx."""

import gzip
import random
import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        gunzip on;
        location /s/ { gzip_static always; }
        location /v/ { gzip_static always; gzip_vary on; }
        location /off/ { gunzip off; gzip_static always; }
        location /p/ { proxy_pass http://127.0.0.1:{port}/s/; }
        location /bad/ { gzip_static always; }
    }
}
"""

rng = random.Random(36)
# Text that compresses but not to nothing: several pieces on the wire.
PLAIN = "".join(f"{rng.randrange(10**9)} line {i}\n" for i in range(40000)).encode()
TWO = gzip.compress(b"first member\n") + gzip.compress(b"second member\n")
FILES = {"s/a.txt.gz": gzip.compress(PLAIN), "v/a.txt.gz": gzip.compress(b"v\n"),
         "off/a.txt.gz": gzip.compress(b"off\n"), "s/two.txt.gz": TWO,
         "bad/a.txt.gz": gzip.compress(PLAIN)[:5000] + b"\x00" * 100}

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed")

SHOWN = ("content-encoding", "content-length", "transfer-encoding", "accept-ranges", "vary")


def ask(port, path, extra="", method="GET", version="1.1"):
    a = exchange(port, f"{method} {path} HTTP/{version}\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode())
    etag = a.headers.get("etag", "")
    return (a.status, {h: a.headers.get(h) for h in SHOWN}, etag.startswith("W/"), a.body)


CASES = [
    ("/s/a.txt", ""),
    ("/s/a.txt", "Accept-Encoding: gzip\r\n"),
    ("/s/a.txt", "Accept-Encoding: br, gzip;q=0\r\n"),
    ("/s/a.txt", "Range: bytes=0-9\r\n"),
    ("/s/two.txt", ""),
    ("/v/a.txt", ""),
    ("/v/a.txt", "Accept-Encoding: gzip\r\n"),
    ("/off/a.txt", ""),
    ("/p/a.txt", ""),
    ("/p/a.txt", "Accept-Encoding: gzip\r\n"),
]


def test_gunzip_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for path, extra in CASES:
            g, n = ask(srv.port, path, extra), ask(nginx_port, path, extra)
            assert g == n, (path, extra, g[:3], n[:3])
        # The point of it, said plainly.
        plain = ask(srv.port, "/s/a.txt")
        assert plain[3] == PLAIN and plain[1]["content-encoding"] is None and plain[2]
        assert ask(srv.port, "/s/two.txt")[3] == b"first member\nsecond member\n"
        assert ask(srv.port, "/s/a.txt", "Accept-Encoding: gzip\r\n")[3] == FILES["s/a.txt.gz"]
        assert ask(srv.port, "/p/a.txt")[3] == PLAIN
        # HTTP/1.0 (gzip_http_version 1.1) and HEAD.
        for method, version in (("GET", "1.0"), ("HEAD", "1.1")):
            g = ask(srv.port, "/s/a.txt", "Accept-Encoding: gzip\r\n", method, version)
            n = ask(nginx_port, "/s/a.txt", "Accept-Encoding: gzip\r\n", method, version)
            assert g == n, (method, version, g[:3], n[:3])
        # A broken gzip file: the answer is cut short (no last chunk), the error logged.
        cut = exchange(srv.port, b"GET /bad/a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert cut.status == 200 and not cut.raw.endswith(b"0\r\n\r\n")
        assert "inflate() failed" in srv.error_log()


def test_gunzip_config(tmp_path):
    for http in ("gunzip maybe;", "gunzip_buffers 4;", "gunzip_buffers x 8k;"):
        n, g = check_both(tmp_path, http)
        assert n.returncode != 0 and g.returncode != 0, (n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr, (n.stderr, g.stderr)
    n, g = check_both(tmp_path, "gunzip on; gunzip_buffers 16 8k;")
    assert n.returncode == 0 and g.returncode == 0, (n.stderr, g.stderr)


SSI_CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        location / {
            gunzip on;
            proxy_pass http://unix:{tmp}/back.sock:/;
            proxy_set_header Accept-Encoding gzip;
        }
        location /t.html { ssi on; }
    }
    server {
        listen unix:{tmp}/back.sock;
        root {root};
        location / { default_type text/plain; gzip_static on; gzip_http_version 1.0; gzip_types text/plain; }
    }
}
"""


def test_an_included_gzip_answer_is_inflated_as_nginx(tmp_path):
    # A subrequest's answer goes into the main one: inflated even for a client that takes
    # gzip (nginx's gzip_ok never holds for a subrequest).
    files = {"t1.gz": gzip.compress(b"X" * 1000), "t.html": b'xxx <!--#include virtual="/t1" --> xxx'}
    with side_by_side(tmp_path, SSI_CONF, files) as (srv, nginx_port):
        for extra in ("", "Accept-Encoding: gzip\r\n"):
            g, n = ask(srv.port, "/t.html", extra), ask(nginx_port, "/t.html", extra)
            assert g[0] == n[0] == 200 and g[3] == n[3] == b"xxx " + b"X" * 1000 + b" xxx", (extra, g[3][:40], n[3][:40])
