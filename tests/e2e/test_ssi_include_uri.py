"""How an SSI include's URI is taken, against Debian's nginx with the same config: the
include is a subrequest that goes through the server's own rewrites (`if` at server
level), its path is percent-decoded (an escaped `?` is part of the file name, not the
start of the arguments), and an argument that is there but empty echoes as empty, not as
"(none)"."""

from __future__ import annotations

import pytest

from nginx_peer import PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        if ($args = "found") { return 200 "server-if"; }
        location / { ssi on; }
    }
}
"""

FILES = {
    "echo.html": "[<!--#echo var=\"arg_a\" -->]",
    "server_if.html": "<!--#include virtual=\"/nowhere?found\" -->",
    "escaped.html": "<!--#include virtual=\"/ech%6f.html?a=x\" -->",
    "question.html": "<!--#include virtual=\"/odd.txt%3f\" -->",
    "odd.txt?": "ODD",
}


@pytest.fixture
def both(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as servers:
        yield servers


@pytest.mark.parametrize(
    "path, body",
    [
        ("/echo.html?a=", b"[]"),
        ("/echo.html", b"[(none)]"),
        ("/server_if.html", b"server-if"),
        ("/escaped.html", b"[x]"),
        ("/question.html", b"ODD"),
    ],
)
def test_include_uri_as_nginx(both, path, body):
    srv, nginx_port = both
    ask = f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()
    ours, theirs = exchange(srv.port, ask), exchange(nginx_port, ask)
    assert (ours.status, ours.body) == (theirs.status, theirs.body) == (200, body)
