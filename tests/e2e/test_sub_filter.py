"""`sub_filter`, `sub_filter_once`, `sub_filter_types` and `sub_filter_last_modified`: the
same config on gannet and Debian's nginx, and the same answers - static files small and
large, several strings, once on and off, case, types, validators, conditional requests,
HEAD, gzip after the rewrite - and a proxied answer sent in pieces, a match cut across
them, whose first piece must reach the client before the application sends the rest (the
answer is never held whole).
"""

from __future__ import annotations

import gzip
import shutil
import socket
import subprocess
import threading

import pytest

import rawapps
from nginx_peer import NGINX, PEER_MAIN, exchange, parse, side_by_side

PAGE = "<html><head><title>Old Title</title></head><body>Hello World. hello world. HELLO WORLD.\n" \
       "<a href='http://old.example/'>old.example</a> nginx gannet</body></html>\n"  # fmt: skip
# Over 64 KiB: served from the file (not the small-file cache), matches in every block.
BIG = "".join(f"line {i:06d}: Hello World at {i}\n" for i in range(4000))

FILES = {
    "once/page.html": PAGE,
    "all/page.html": PAGE,
    "all/page.txt": PAGE,
    "all/big.html": BIG,
    "typed/page.txt": PAGE,
    "typed/page.css": PAGE,
    "any/page.bin": PAGE,
    "lm/page.html": PAGE,
    "vars/page.html": PAGE,
    "gz/page.html": PAGE * 20,
    "empty/page.html": "",
}

CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    types { text/html html; text/plain txt; text/css css; application/octet-stream bin; }
    sub_filter "hello world" "Hi there";
    server {
        listen 127.0.0.1:{port};
        server_name main.test;
        location /once/ {
            sub_filter "<title>old title</title>" "<title>New</title>";
            sub_filter "hello world" "Hi";
        }
        location /all/ {
            sub_filter_once off;
            sub_filter "HELLO world" "Hi";
            sub_filter old.example new.test;
        }
        location /typed/ { sub_filter_types text/plain; sub_filter_once off; }
        location /any/ { sub_filter_types *; }
        location /lm/ { sub_filter_last_modified on; }
        location /vars/ {
            sub_filter "$arg_from" "[$arg_to $uri]";
            sub_filter_once off;
        }
        location /gz/ { gzip on; gzip_min_length 1; sub_filter_once off; }
        location /empty/ { }
        location /proxied/ {
            sub_filter_once off;
            sub_filter "hello world" "Hi there";
            sub_filter "<p>" "<P class=x>";
            proxy_pass http://127.0.0.1:APPPORT;
            proxy_buffering off;
        }
    }
}
"""


def req(path: str, *headers: str, method: str = "GET") -> bytes:
    extra = "".join(h + "\r\n" for h in headers)
    return f"{method} {path} HTTP/1.1\r\nHost: main.test\r\n{extra}Connection: close\r\n\r\n".encode()


SENT = [
    req("/once/page.html"),
    req("/all/page.html"),
    req("/all/page.txt"),
    req("/all/big.html"),
    req("/typed/page.txt"),
    req("/typed/page.css"),
    req("/any/page.bin"),
    req("/lm/page.html"),
    req("/vars/page.html?from=old.example&to=NEW"),
    req("/once/page.html", method="HEAD"),
    req("/once/page.html", "Range: bytes=0-9"),
    req("/once/missing.html"),
    req("/empty/page.html"),
]

COMPARED = ["content-type", "content-length", "last-modified", "accept-ranges", "content-encoding"]


def view(a):
    fields = {"status": a.status} | {h: a.headers.get(h) for h in COMPARED}
    # nginx's weak ETag of a file is its own; whether it is there and weak is compared.
    etag = a.headers.get("etag")
    fields["etag"] = etag and etag.startswith("W/")
    fields["chunked"] = "chunked" in a.headers.get("transfer-encoding", "")
    return fields, a.body.replace(b"<center>gannet</center>", b"<center>nginx</center>")


@pytest.fixture
def apps():
    yield from rawapps.made(rawapps.HttpApp)


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_same_answers_as_nginx(tmp_path, apps):
    conf = CONF.replace("APPPORT", "1")
    with side_by_side(tmp_path, conf, FILES) as (srv, nginx_port):
        answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in SENT]
        lm = answers[SENT.index(req("/lm/page.html"))][0].headers["last-modified"]
        cond = req("/once/page.html", f"If-Modified-Since: {lm}")
        answers.append((exchange(nginx_port, cond), exchange(srv.port, cond)))
        zipped = req("/gz/page.html", "Accept-Encoding: gzip")
        gz = (exchange(nginx_port, zipped), exchange(srv.port, zipped))
    diffs = []
    for r, (a_n, a_g) in zip(SENT + [cond], answers):
        if view(a_n) != view(a_g):
            diffs.append(f"{r.split(b' HTTP')[0].decode()}:\n  nginx  {view(a_n)}\n  gannet {view(a_g)}")
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    got = {r.split(b" HTTP")[0].decode(): a_g for r, (_, a_g) in zip(SENT, answers)}
    # What the rules above must have done (so that agreeing on no change cannot pass).
    once = got["GET /once/page.html"].body.decode()
    assert "<title>New</title>" in once and "Hi. hello world. HELLO WORLD." in once
    assert got["GET /all/page.html"].body.count(b"Hi") == 3 and b"new.test" in got["GET /all/page.html"].body
    assert got["GET /all/page.txt"].body == PAGE.encode()
    assert got["GET /all/big.html"].body == BIG.replace("Hello World", "Hi").encode()
    assert got["GET /typed/page.txt"].body.count(b"Hi there") == 3
    assert got["GET /typed/page.css"].body == PAGE.encode()
    assert b"[NEW /vars/page.html]" in got["GET /vars/page.html?from=old.example&to=NEW"].body
    assert got["GET /once/page.html"].headers.get("last-modified") is None
    assert answers[-1][1].status == 304
    # gzip compresses the rewritten body.
    (g_n, g_g) = gz
    assert g_g.headers["content-encoding"] == g_n.headers["content-encoding"] == "gzip"
    assert gzip.decompress(g_g.body) == gzip.decompress(g_n.body) == (PAGE * 20).replace("Hello World", "Hi there").replace("hello world", "Hi there").replace("HELLO WORLD", "Hi there").encode()


class Pieces:
    """An application answering in two pieces: the second only once the test saw what
    the server made of the first."""

    def __init__(self):
        self.go = threading.Event()

    def __call__(self, conn, head, body):
        self.go.clear()
        one, two = b"<html><p>first part</p>\n<div>Hello Wor", b"ld</div><p>second</p></html>\n\n"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                     b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n" % (len(one) + len(two)))  # fmt: skip
        conn.sendall(one)
        if not self.go.wait(10):
            return
        conn.sendall(two)


def pieces_exchange(port: int, app: Pieces, request: bytes, first: bytes):
    """Send `request`; once `first` came back, let the application go on; the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        got = b""
        while first not in got:
            b = s.recv(65536)
            assert b, f"closed before {first!r} came: {got!r}"
            got += b
        app.go.set()
        while b := s.recv(65536):
            got += b
    return parse(got)


def test_streamed_answer_split_across_pieces(gannet, apps):
    app = Pieces()
    listener = apps(app)
    srv = gannet.start(conf=CONF.replace("APPPORT", str(listener.port)), files=FILES)
    # "<P class=x>first part" is out before the second piece is sent: not held whole.
    a = pieces_exchange(srv.port, app, req("/proxied/x"), b"<P class=x>first part</p>")
    assert a.status == 200
    assert a.body == b"<html><P class=x>first part</p>\n<div>Hi there</div><P class=x>second</p></html>\n\n"
    assert "content-length" not in a.headers and "last-modified" not in a.headers
    assert a.headers["transfer-encoding"] == "chunked"


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_streamed_answer_as_nginx(tmp_path, apps):
    app = Pieces()
    listener = apps(app)
    conf = CONF.replace("APPPORT", str(listener.port))
    with side_by_side(tmp_path, conf, FILES) as (srv, nginx_port):
        n = pieces_exchange(nginx_port, app, req("/proxied/x"), b"first part")
        g = pieces_exchange(srv.port, app, req("/proxied/x"), b"first part")
    assert view(n) == view(g)
    assert b"<div>Hi there</div>" in g.body


def test_compressed_upstream_answer_is_left_alone(gannet, apps):
    packed = gzip.compress(b"hello world " * 50)

    def app(conn, head, body):
        conn.sendall(rawapps.http_answer(packed, headers="Content-Type: text/html\r\nContent-Encoding: gzip\r\n"))

    listener = apps(app)
    srv = gannet.start(conf=CONF.replace("APPPORT", str(listener.port)), files=FILES)
    a = exchange(srv.port, req("/proxied/z"))
    assert a.headers["content-encoding"] == "gzip"
    assert gzip.decompress(a.body) == b"hello world " * 50


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_http2_rewrites_the_same(gannet):
    conf = CONF.replace("APPPORT", "1").replace("server_name main.test;", "server_name main.test; http2 on;")
    srv = gannet.start(conf=conf, files=FILES)
    for path, want in (("/all/big.html", BIG.replace("Hello World", "Hi")), ("/once/page.html", None)):
        r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", f"http://127.0.0.1:{srv.port}{path}"],
                           capture_output=True, timeout=30)  # fmt: skip
        h1 = exchange(srv.port, req(path)).body
        assert r.stdout == h1
        if want:
            assert r.stdout == want.encode()


@pytest.mark.parametrize("body, message", [
    ('sub_filter "" x;', "empty search pattern"),
    ("sub_filter a;", 'invalid number of arguments in "sub_filter" directive'),
    ("sub_filter_once maybe;", 'invalid value "maybe" in "sub_filter_once" directive'),
    ("sub_filter_last_modified 1;", 'invalid value "1" in "sub_filter_last_modified" directive'),
    ("sub_filter_types;", 'invalid number of arguments in "sub_filter_types" directive'),
    ("sub_filter $nonesuch x;", 'unknown "nonesuch" variable'),
    ("".join(f"sub_filter s{i} x;" for i in range(256)), "number of search patterns exceeds 255"),
])  # fmt: skip
def test_config_errors(gannet, body, message):
    r = gannet.check(server=f"location / {{ {body} }}")
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert ".conf:" in r.stderr, r.stderr


def test_fastcgi_answer_in_records_split_mid_match(gannet):
    """A FastCGI answer of unknown length, streamed: its match is cut across two STDOUT
    records, the second sent only once the client has what came before the match."""
    gate = Pieces()

    def app(conn):
        conn.sendall(rawapps.stdout(b"Content-Type: text/html\r\n\r\n<b>first</b> hello wo"))
        if gate.go.wait(10):
            conn.sendall(rawapps.stdout(b"rld</b> and Hello World\n") + rawapps.end_request())

    listener = rawapps.FastCgiApp(app)
    try:
        srv = gannet.start(server=f"""
            location /php/ {{
                sub_filter "hello world" "HI";
                sub_filter_once off;
                fastcgi_pass 127.0.0.1:{listener.port};
            }}""")
        a = pieces_exchange(srv.port, gate, req("/php/x"), b"<b>first</b> ")
        assert a.status == 200
        assert a.body == b"<b>first</b> HI</b> and HI\n"
    finally:
        listener.close()
