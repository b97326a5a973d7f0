"""`autoindex_format html|xml|json|jsonp` against Debian's nginx: the same directory (names
with quotes, angle brackets, ampersands, control characters and UTF-8; a subdirectory; links
to a file, to a directory and to nothing) listed by both, byte for byte; `?callback=` for
jsonp (none, empty, valid, invalid, too long).
"""

from __future__ import annotations

import os

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        autoindex on;
        location /html/ { alias {root}/d/; }
        location /htmlutf/ { alias {root}/d/; charset utf-8; }
        location /xml/ { alias {root}/d/; autoindex_format xml; }
        location /json/ { alias {root}/d/; autoindex_format json; }
        location /jsonp/ { alias {root}/d/; autoindex_format jsonp; }
        location /empty/ { alias {root}/e/; autoindex_format xml; }
        location /emptyjson/ { alias {root}/e/; autoindex_format jsonp; }
    }
}
"""

FILES = {
    "d/plain.txt": "x" * 42,
    "d/quote-'-\"-<>-&.txt": "q",
    "d/tab\there": "t",
    "d/utf8-\u0444\u0444\u0444.txt": "u",
    "d/utf8-" + "\u0444" * 45: "long",
    "d/sub/inner": "i",
    "e/.hidden": "h",
}

PATHS = [
    "/html/",
    "/htmlutf/",
    "/xml/",
    "/json/",
    "/jsonp/",
    "/jsonp/?callback=cb.fn_1",
    "/jsonp/?callback=",
    "/jsonp/?callback=bad-name",
    "/jsonp/?callback=" + "a" * 129,
    "/empty/",
    "/emptyjson/?callback=f",
]


def get(port: int, path: str):
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())


def test_listings_match_nginx_byte_for_byte(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        d = srv.root / "d"
        os.symlink(d / "plain.txt", d / "link-file")
        os.symlink(d / "sub", d / "link-dir")
        os.symlink(d / "missing", d / "link-broken")
        for path in PATHS:
            g, n = get(srv.port, path), get(nginx_port, path)
            assert (g.status, g.headers.get("content-type")) == (n.status, n.headers.get("content-type")), path
            if n.status == 200:
                assert g.body == n.body, path
        # Not vacuous: each format's marks are there.
        xml = get(srv.port, "/xml/")
        assert xml.headers["content-type"] == "text/xml; charset=utf-8"
        assert b'<file mtime="' in xml.body and b'size="42">plain.txt</file>' in xml.body
        assert b"<directory mtime=" in xml.body and b"<other mtime=" in xml.body
        assert b"quote-'-&quot;-&lt;&gt;-&amp;.txt</file>" in xml.body
        jsonp = get(srv.port, "/jsonp/?callback=cb.fn_1")
        assert jsonp.headers["content-type"] == "application/javascript"
        assert jsonp.body.startswith(b"/* callback */\r\ncb.fn_1([\r\n{ ") and jsonp.body.endswith(b"\r\n]);")
        assert b'"name":"tab\\there"' in get(srv.port, "/json/").body
        assert get(srv.port, "/jsonp/?callback=bad-name").status == 400
        assert get(srv.port, "/empty/").body == b'<?xml version="1.0"?>\r\n<list>\r\n</list>\r\n'
