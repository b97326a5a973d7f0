"""add_before_body, add_after_body, addition_types: subrequests' bodies around a 200
answer of the types (files and proxied answers, subrequests to files, to an upstream and
to a missing page), compressed together, side by side with Debian's nginx."""

import gzip
import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    include {repo}/conf/mime.types;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location / { add_before_body /parts/before.html; add_after_body /parts/after.html; }
        location /parts/ { }
        location /raw/ { add_before_body ""; add_after_body ""; }
        location /t/ { add_before_body /parts/before.html; addition_types text/plain; }
        location /p/ { add_after_body /parts/after.html; proxy_pass http://127.0.0.1:{port}/raw/; }
        location /up/ { add_before_body /praw/before.html; add_after_body /nope.html; }
        location /praw/ { proxy_pass http://127.0.0.1:{port}/raw/; }
        location /z/ { gzip on; add_before_body /parts/before.html; }
    }
}
"""

BIG = "".join(f"<p>row {i}</p>\n" for i in range(20000))
FILES = {"index.html": "<main>page</main>\n", "a.txt": "text\n", "t/a.txt": "plain\n",
         "parts/before.html": "<header>B</header>\n", "parts/after.html": "<footer>A</footer>\n",
         "raw/before.html": "<header>proxied B</header>\n", "raw/big.html": BIG,
         "up/x.html": "<main>up</main>\n", "z/big.html": BIG}

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed")

SHOWN = ("content-length", "transfer-encoding", "accept-ranges", "content-type", "content-encoding")


def ask(port, path, extra="", method="GET"):
    a = exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode())
    body = gzip.decompress(a.body) if a.headers.get("content-encoding") == "gzip" else a.body
    # The 404 page inside a body names the server: compare what it says.
    body = re.sub(rb"<hr><center>[^<]*</center>", b"", body)
    return a.status, {h: a.headers.get(h) for h in SHOWN}, a.headers.get("etag", "").startswith("W/"), body


CASES = [("/index.html", ""), ("/a.txt", ""), ("/t/a.txt", ""), ("/nothere.html", ""),
         ("/index.html", "Range: bytes=0-3\r\n"), ("/p/big.html", ""), ("/up/x.html", ""),
         ("/z/big.html", "Accept-Encoding: gzip\r\n"), ("/index.html", "", "HEAD")]


def test_addition_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for case in CASES:
            g, n = ask(srv.port, *case), ask(nginx_port, *case)
            assert g == n, (case, g[:3], n[:3], g[3][:300], n[3][:300])
        # What it is, said plainly.
        assert ask(srv.port, "/index.html")[3] == b"<header>B</header>\n<main>page</main>\n<footer>A</footer>\n"
        assert ask(srv.port, "/p/big.html")[3] == BIG.encode() + b"<footer>A</footer>\n"
        up = ask(srv.port, "/up/x.html")[3]
        assert up.startswith(b"<header>proxied B</header>\n<main>up</main>\n") and b"404 Not Found" in up
        z = exchange(srv.port, b"GET /z/big.html HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n")
        assert z.headers.get("content-encoding") == "gzip"
        assert gzip.decompress(z.body) == b"<header>B</header>\n" + BIG.encode()


def test_addition_config(tmp_path):
    for http in ("add_before_body /a /b;", "add_after_body /a; add_after_body /b;"):
        n, g = check_both(tmp_path, http)
        assert n.returncode != 0 and g.returncode != 0, (n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr, (n.stderr, g.stderr)


def test_addition_and_gunzip_over_http2(gannet):
    """HTTP/2 (h2c, curl) goes through the same filters: the subrequest's body, and an
    inflated gzip file."""
    import subprocess
    srv = gannet.start(
        server="http2 on; location = /index.html { add_before_body /parts/before.html; add_after_body /parts/after.html; }"
               " location /s/ { gzip_static always; gunzip on; }",
        files={**FILES, "s/g.txt.gz": gzip.compress(b"inflated\n")})
    def curl(path):
        return subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-w", "%{http_version}", f"{srv.base}{path}"],
                              capture_output=True, timeout=10).stdout
    assert curl("/index.html") == b"<header>B</header>\n<main>page</main>\n<footer>A</footer>\n2"
    assert curl("/s/g.txt") == b"inflated\n2"
