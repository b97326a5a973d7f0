"""`ssi` and its directives: the same config on gannet and Debian's nginx, and the same
pages - every command (`include` virtual / file / set / stub, `echo` with its encodings,
`set` with variables, `if` / `elif` / `else` / `endif` with strings, negation and regex
captures, `config errmsg` / `timefmt`, `block`), nested includes, a proxied include, errors
with and without `ssi_silent_errors`, headers (Content-Length, Last-Modified) - and a proxied
page sent byte by byte, split inside its commands, whose first part must reach the client
before the upstream sends the rest.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading

import pytest

import rawapps
from nginx_peer import NGINX, PEER_MAIN, exchange, parse, side_by_side

PAGE = """<html>A <!--# echo var="arg_x" --> B <!--# echo var="arg_none" default="dflt" -->
<!--# echo var="nothing_at_all" --> <!--#echo var="arg_q" encoding="none" -->|<!--# echo var="arg_q" -->|<!--# echo var="arg_q" encoding="url" -->|<!--# echo var="arg_q" -->
<!--# set var="v" value="x=$arg_x/${uri}\\$z\\n" --><!--# echo var="v" -->
<!--# if expr="$arg_x = abc" -->EQ<!--# elif expr="$arg_x" -->SET<!--# else -->NONE<!--# endif -->
<!--# if expr="$arg_x != abc" -->NE<!--# else -->NOTNE<!--# endif -->
<!--# if expr="$arg_x = /^a(.)(?<rest>.*)/" -->re <!--# echo var="1" --> <!--# echo var="rest" --><!--# endif --> <!--# if expr="$arg_x = /z$/" -->dollar<!--# endif -->
<!--# if expr="$arg_none" -->never<!--# if expr="x" -->inner<!--# endif -->
<!--# include virtual="inc/one.html" -->|<!--# include file="/inc/two.html" -->|<!--# include virtual="/inc/nested.html?a=1" -->
<!--# include virtual="/up/part" --> after proxy
<!--# include virtual="/inc/one.html" set="got" -->[<!--# echo var="got" -->]
<!--# block name="fallback" -->STUB <!--# echo var="v" --> TEXT<!--# endblock -->
<!--# include virtual="/inc/empty.html" stub="fallback" -->|<!--# include virtual="/inc/missing.html" stub="fallback" -->
<!--# include virtual="/inc/missing.html" -->
<!--# bogus a="b" --> <!--# echo --> <!--# echo var="a" var="b" --> <!--# echo var="a" what="b" -->
<!--# include virtual="/a" file="/b" --> <!--# include --> <!--# include virtual="/a" wait="maybe" -->
<!--# if expr="$a ~ b" -->x<!--# endif --> <!--# else --> <!-- plain comment --> <!- almost <!--x
<!--# echo var=noquote --> <!--# echo var="a"x --> <!--# thisnameiswaytoolongforacommandinnginxssi -->
<!--# config errmsg="[oops]" --><!--# bogus --><!--# config timefmt="%Y" --><!--# echo var="date_gmt" -->
<!--# echo var="v"--><!--#echo	var='single "q"'--> end</html>
"""

FILES = {
    "page.html": PAGE,
    "silent/page.html": PAGE,
    "lm/page.html": "<p><!--# echo var=\"uri\" --></p>",
    "inc/one.html": "ONE",
    "inc/two.html": "TWO <!--# echo var=\"uri\" -->",
    "inc/nested.html": "N1[<!--# echo var=\"arg_a\" --> <!--# include virtual=\"deeper.html\" wait=\"yes\" --> <!--# echo var=\"v\" -->]",
    "inc/deeper.html": "D2 <!--# set var=\"v\" value=\"from deeper\" -->",
    "inc/empty.html": "",
    "plain.txt": "<!--# echo var=\"uri\" -->",
    "loop/self.html": "L<!--# include virtual=\"/loop/self.html\" -->",
}

CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    types { text/html html; text/plain txt; }
    server {
        listen 127.0.0.1:{port};
        server_name main.test;
        ssi on;
        location /silent/ { ssi_silent_errors on; }
        location /lm/ { ssi_last_modified on; }
        location /up/ {
            proxy_pass http://127.0.0.1:APPPORT;
            proxy_buffering off;
        }
        location /slow/ {
            proxy_pass http://127.0.0.1:APPPORT;
            proxy_buffering off;
        }
        location /short/ { ssi_value_length 4; alias {root}/; }
    }
}
"""


def req(path: str, *headers: str, method: str = "GET") -> bytes:
    extra = "".join(h + "\r\n" for h in headers)
    return f"{method} {path} HTTP/1.1\r\nHost: main.test\r\n{extra}Connection: close\r\n\r\n".encode()


class Upstream:
    """`/up/part`: a fragment with a command; `/slow/page`: an SSI page sent a
    byte at a time, the second half only once `go` is set."""

    def __init__(self):
        self.go = threading.Event()
        self.go.set()

    def __call__(self, conn, head, body):
        if b"/up/part" in head:
            parts = (b"PROXY ", b"<!--# echo ", b'var="uri" -->')
            # One write: nginx 1.22 (unbuffered, a command split across reads) sometimes
            # stalls on a split one; the split case is test_streamed_page_split_inside_commands'.
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(b"".join(parts))
                         + b"".join(parts))
            return
        page = SLOW_PAGE
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                     b"Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n" % len(page))  # fmt: skip
        half = page.index(b"SECOND")
        for i in range(len(page)):
            if i == half and not self.go.wait(10):
                return
            conn.sendall(page[i : i + 1])


SLOW_PAGE = b'FIRST <!--# set var="s" value="split" --><!--# echo var="s" --> <!--# include virtual="/inc/one.html" -->\nSECOND <!--# echo var="s" --> <!--# if expr="$s = /^sp(l)i/" -->$1=<!--# echo var="1" --><!--# endif --> done\n'  # fmt: skip

SENT = [
    req("/page.html?x=abc&q=%3Ca%20b%3E%22%26%23"),
    req("/page.html?x=zzz"),
    req("/page.html"),
    req("/silent/page.html?x=abc"),
    req("/lm/page.html"),
    req("/plain.txt"),
    req("/inc/empty.html"),
    req("/loop/self.html"),
    req("/short/inc/nested.html"),
    req("/page.html", method="HEAD"),
    req("/slow/page"),
]

COMPARED = ["content-type", "content-length", "last-modified", "accept-ranges", "etag"]


def view(a):
    fields = {"status": a.status} | {h: a.headers.get(h) is not None for h in COMPARED}
    fields["etag-weak"] = (a.headers.get("etag") or "").startswith("W/")
    return fields, a.body.replace(b"<center>gannet</center>", b"<center>nginx</center>")


@pytest.fixture
def apps():
    yield from rawapps.made(rawapps.HttpApp)


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_same_pages_as_nginx(tmp_path, apps):
    listener = apps(Upstream())
    conf = CONF.replace("APPPORT", str(listener.port))
    with side_by_side(tmp_path, conf, FILES) as (srv, nginx_port):
        answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in SENT]
    diffs = []
    for r, (a_n, a_g) in zip(SENT, answers):
        if view(a_n) != view(a_g):
            diffs.append(f"{r.split(b' HTTP')[0].decode()}:\n  nginx  {view(a_n)}\n  gannet {view(a_g)}")
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    got = {r.split(b" HTTP")[0].decode(): a_g for r, (_, a_g) in zip(SENT, answers)}
    # What the commands must have done (so that agreeing on no change cannot pass).
    page = got["GET /page.html?x=abc&q=%3Ca%20b%3E%22%26%23"].body.decode()
    assert "A abc B dflt" in page and "EQ" in page and "re b c" in page and "ONE|TWO /inc/two.html|N1[1 D2" in page
    assert "PROXY /up/part after proxy" in page and "[ONE]" in page and "[an error occurred" in page and "[oops]" in page
    assert "<!--# " not in page
    silent = got["GET /silent/page.html?x=abc"].body.decode()
    assert "[an error occurred" not in silent and "[oops]" not in silent and "re b c" in silent
    assert "content-length" not in got["GET /page.html?x=zzz"].headers
    assert "last-modified" not in got["GET /page.html?x=zzz"].headers
    assert "last-modified" in got["GET /lm/page.html"].headers
    assert got["GET /plain.txt"].body == FILES["plain.txt"].encode()
    assert got["GET /slow/page"].body.startswith(b"FIRST split ONE\nSECOND split $1=l done")


def test_streamed_page_split_inside_commands(gannet, apps):
    """The page comes a byte at a time; what precedes "SECOND" (up to the include's "ONE")
    reaches the client before
    the upstream sends the rest, with its commands (cut into single bytes) run."""
    up = Upstream()
    listener = apps(up)
    srv = gannet.start(conf=CONF.replace("APPPORT", str(listener.port)), files=FILES)
    up.go.clear()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(req("/slow/page"))
        got = b""
        while b"ONE" not in got:
            b = s.recv(65536)
            assert b, f"closed early: {got!r}"
            got += b
        up.go.set()
        while b := s.recv(65536):
            got += b
    a = parse(got)
    assert a.status == 200 and "content-length" not in a.headers and "last-modified" not in a.headers
    assert a.body == b"FIRST split ONE\nSECOND split $1=l done\n"


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_http2_same_page(gannet, apps):
    listener = apps(Upstream())
    conf = CONF.replace("APPPORT", str(listener.port)).replace("server_name main.test;", "server_name main.test; http2 on;")
    srv = gannet.start(conf=conf, files=FILES)
    path = "/page.html?x=abc"
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", f"http://127.0.0.1:{srv.port}{path}"],
                       capture_output=True, timeout=30)  # fmt: skip
    h1 = exchange(srv.port, req(path)).body
    assert r.stdout == h1 and b"PROXY /up/part" in h1 and b"N1[" in h1


@pytest.mark.parametrize("body, message", [
    ("ssi maybe;", 'invalid value "maybe" in "ssi" directive'),
    ("ssi_value_length abc;", '"ssi_value_length" directive invalid value'),
    ("ssi_types;", 'invalid number of arguments in "ssi_types" directive'),
    ("ssi_silent_errors on off;", 'invalid number of arguments in "ssi_silent_errors" directive'),
])  # fmt: skip
def test_config_errors(gannet, body, message):
    r = gannet.check(server=f"location / {{ {body} }}")
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert ".conf:" in r.stderr, r.stderr
