"""The content handler of `if` blocks, side by side with Debian's nginx: an `if` block that
names an application (`proxy_pass`...) makes it the request's handler, and a later matched
`if` that names none keeps it, with its own settings - which, when the location has no
such application, lack it: nginx answers 500 ("no upstream configuration", an alert).
When the location has one, or the later block names its own, the request is passed.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange_from, parse, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen unix:{tmp}/up.sock;
        location / { return 200 "up $uri\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        # The second `if` names nothing: the first's proxy_pass has no settings there.
        location /orphan {
            set $true 1;
            if ($true) { proxy_pass http://unix:{tmp}/up.sock; }
            if ($true) { }
        }
        # Only the first matches: it passes.
        location /one {
            if ($arg_a) { proxy_pass http://unix:{tmp}/up.sock; }
            if ($arg_b) { }
        }
        # The location passes too: the second block inherits its upstream and URI.
        location /inherited {
            proxy_pass http://unix:{tmp}/up.sock:/loc;
            set $true 1;
            if ($true) { proxy_pass http://unix:{tmp}/up.sock; }
            if ($true) { }
        }
        # The second block names its own.
        location /second {
            set $true 1;
            if ($true) { }
            if ($true) { proxy_pass http://unix:{tmp}/up.sock; }
        }
        # A `return` after the orphaning block still answers.
        location /returned {
            set $true 1;
            if ($true) { proxy_pass http://unix:{tmp}/up.sock; }
            if ($true) { }
            return 204;
        }
    }
}
"""

PATHS = ["/orphan", "/one?a=1", "/one?a=1&b=1", "/one?b=1", "/inherited", "/second", "/returned"]


def answer(port: int, path: str) -> tuple[int, bytes]:
    raw, _ = exchange_from(port, f"GET {path} HTTP/1.0\r\nHost: a\r\n\r\n".encode(), "127.0.0.1")
    a = parse(raw)
    return a.status, a.body if a.status == 200 else b""


def test_if_blocks_keep_the_content_handler_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        ours = [answer(srv.port, p) for p in PATHS]
        assert ours == [answer(nginx_port, p) for p in PATHS]
        assert [a[0] for a in ours] == [500, 200, 500, 404, 200, 200, 204]
        assert ours[1] == (200, b"up /one\n") and ours[4] == (200, b"up /loc\n")
        assert "[alert]" in (srv.tmp / "error.log").read_text()
        assert "no upstream configuration" in (srv.tmp / "error.log").read_text()
