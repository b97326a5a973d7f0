"""The charset module: `charset`, `source_charset`, `override_charset`, `charset_types` and
Debian's `charset_map` files (koi-win, koi-utf, win-utf) on gannet and Debian's nginx with
one config: the same Content-Type and the same body bytes - a windows-1251 file served as
UTF-8 and a UTF-8 file as windows-1251 and KOI8-R, names added only to the listed types,
`charset off`, a variable, redirects and error pages - plus a recoding nginx lacks a table
for (encoding_rs) and a big file recoded across pieces.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

TEXT = "Привет, мир! Съешь же ещё этих мягких французских булок. ASCII stays.\n"
WIN = TEXT.encode("cp1251")
UTF = TEXT.encode()
# Over 64 KiB: read from the file in several pieces, a character cut at some of them.
BIG = TEXT * 1200

FILES = {
    "w2u/page.html": WIN,
    "w2u/big.html": BIG.encode("cp1251"),
    "u2w/page.html": UTF,
    "u2k/page.txt": UTF,
    "k2w/page.html": TEXT.encode("koi8-r"),
    "name/page.html": UTF,
    "name/page.css": UTF,
    "name/page.js": UTF,
    "off/page.html": UTF,
    "var/page.html": UTF,
}

CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    types { text/html html; text/plain txt; text/css css; application/javascript js; }
    include /etc/nginx/koi-win;
    include /etc/nginx/koi-utf;
    include /etc/nginx/win-utf;
    charset utf-8;
    server {
        listen 127.0.0.1:{port};
        server_name main.test;
        location /w2u/ { source_charset windows-1251; }
        location /u2w/ { source_charset utf-8; charset windows-1251; }
        location /u2k/ { source_charset utf-8; charset koi8-r; }
        location /k2w/ { source_charset koi8-r; charset windows-1251; }
        location /name/ { }
        location /off/ { charset off; }
        location /var/ { charset $arg_cs; }
        location = /moved { return 301 /name/page.html; }
    }
}
"""


def req(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".encode()


PATHS = ["/w2u/page.html", "/w2u/big.html", "/u2w/page.html", "/u2k/page.txt", "/k2w/page.html",
         "/name/page.html", "/name/page.css", "/name/page.js", "/off/page.html", "/var/page.html?cs=koi8-r",
         "/name/missing.html", "/moved"]  # fmt: skip


def view(a):
    h = a.headers
    cl = h.get("content-length")
    if cl and b"<center>gannet</center>" in a.body:
        cl = str(int(cl) - 1)  # "gannet" vs "nginx" on the built-in pages
    return (a.status, h.get("content-type"), cl,
            a.body.replace(b"<center>gannet</center>", b"<center>nginx</center>"))  # fmt: skip


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_same_answers_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        answers = {p: (exchange(nginx_port, req(p)), exchange(srv.port, req(p))) for p in PATHS}
        head = (exchange(nginx_port, req("/w2u/page.html", "HEAD")), exchange(srv.port, req("/w2u/page.html", "HEAD")))
    diffs = [f"{p}:\n  nginx  {view(n)[:3]} {view(n)[3][:80]!r}\n  gannet {view(g)[:3]} {view(g)[3][:80]!r}"
             for p, (n, g) in answers.items() if view(n) != view(g)]  # fmt: skip
    assert not diffs, "differences from nginx:\n" + "\n".join(diffs)
    assert head[0].headers.get("content-type") == head[1].headers.get("content-type")
    got = {p: g for p, (_, g) in answers.items()}
    # What the configuration must have done, so that agreeing on nothing cannot pass.
    assert got["/w2u/page.html"].body == UTF
    assert got["/w2u/page.html"].headers["content-type"] == "text/html; charset=utf-8"
    assert got["/w2u/big.html"].body == BIG.encode()
    assert got["/u2w/page.html"].body == WIN
    assert got["/u2k/page.txt"].body == TEXT.encode("koi8-r")
    assert got["/k2w/page.html"].body == WIN
    assert got["/name/page.css"].headers["content-type"] == "text/css"
    assert got["/name/page.js"].headers["content-type"] == "application/javascript; charset=utf-8"
    assert got["/off/page.html"].headers["content-type"] == "text/html"
    assert got["/var/page.html?cs=koi8-r"].headers["content-type"] == "text/html; charset=koi8-r"
    assert got["/name/missing.html"].headers["content-type"] == "text/html; charset=utf-8"
    assert got["/moved"].headers["content-type"] == "text/html"


def test_recodes_without_a_table_and_keeps_a_proxied_charset(gannet):
    """No charset_map between windows-1251 and iso-8859-5: gannet recodes with encoding_rs
    (nginx would log "no charset_map" and send the bytes unchanged)."""
    srv = gannet.start(
        files={"a/page.html": WIN, "b/page.html": UTF},
        server="""
        location /a/ { source_charset windows-1251; charset iso-8859-5; }
        location /b/ { source_charset utf-8; charset utf-16; }
        """,
    )
    a = exchange(srv.port, req("/a/page.html"))
    assert a.headers["content-type"] == "text/html; charset=iso-8859-5"
    assert a.body == TEXT.encode("iso-8859-5")
    # UTF-16 cannot be written: the answer goes out unchanged, without a charset name.
    b = exchange(srv.port, req("/b/page.html"))
    assert b.headers["content-type"] == "text/html" and b.body == UTF


# An application's `X-Accel-Charset` names the charset its answer is to be sent in, whatever
# the location's `charset` says: recoded by the map here, from the cache too, and in ranges
# (each part names the new charset) since the map is byte to byte.
ACCEL_CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    types { text/html html; }
    charset_map B A { 58 59; }
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=C:1m;
    server {
        listen 127.0.0.1:{port};
        location / { proxy_pass http://unix:{tmp}/back.sock:; proxy_cache C; proxy_cache_valid 200 1m; }
    }
    server {
        listen unix:{tmp}/back.sock;
        root {root};
        charset B;
        location /accel/ { add_header X-Accel-Charset A; }
    }
}
"""
ACCEL_BODY = "".join(f"X{i:03d}XXXXXX" for i in range(100)).encode()


def ranged(a) -> tuple:
    """Status, Content-Type (the boundary left out) and body (the boundary replaced)."""
    ct = a.headers.get("content-type", "")
    body = a.body
    if "boundary=" in ct:
        boundary = ct.split("boundary=", 1)[1]
        body = body.replace(boundary.encode(), b"BOUNDARY")
        ct = ct.split("boundary=", 1)[0]
    return a.status, ct, body


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_accel_charset_recodes_cached_ranges_as_nginx(tmp_path):
    files = {"accel/t.html": ACCEL_BODY, "plain/t.html": ACCEL_BODY}
    rng = "GET {} HTTP/1.1\r\nHost: main.test\r\nRange: bytes=0-9, 10-19\r\nConnection: close\r\n\r\n"
    with side_by_side(tmp_path, ACCEL_CONF, files) as (srv, nginx_port):
        got = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            first = {p: exchange(port, req(p)) for p in ("/accel/t.html", "/plain/t.html")}
            ranges = {p: exchange(port, rng.format(p).encode()) for p in ("/accel/t.html", "/plain/t.html")}
            got[name] = ({p: (a.status, a.headers.get("content-type"), a.body) for p, a in first.items()},
                         {p: ranged(a) for p, a in ranges.items()})  # fmt: skip
    assert got["gannet"] == got["nginx"]
    whole, parts = got["gannet"]
    assert whole["/accel/t.html"] == (200, "text/html; charset=A", ACCEL_BODY.replace(b"X", b"Y"))
    assert whole["/plain/t.html"] == (200, "text/html; charset=B", ACCEL_BODY)
    status, _, body = parts["/accel/t.html"]
    assert status == 206 and b"Content-Type: text/html; charset=A\r\n" in body
    assert b"Y000YYYYYY" in body and b"Y001YYYYYY" in body
