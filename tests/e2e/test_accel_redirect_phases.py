"""An X-Accel-Redirect's internal redirect, on gannet and Debian's nginx with one config:
it goes through the server's rewrite statements again (a server-level `if` on
`$upstream_http_x_accel_redirect` sees the answer that asked for it), `$request_method`
is GET from then on, and the answer keeps nginx's carried headers. The same server-level
statements see an index module's redirect.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        if ($upstream_http_x_accel_redirect) {
            return 200 "xar: $upstream_http_x_accel_redirect uri: $uri method: $request_method";
        }
        if ($uri = /dir/index.html) { return 200 "index redirect seen"; }
        location /proxy { proxy_pass http://127.0.0.1:{port}/return-xar; }
        location /return-xar {
            add_header X-Accel-Redirect $arg_xar;
            add_header Set-Cookie blah=blah;
            add_header Something other;
            return 204;
        }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_accel_redirect_through_server_rewrites_as_nginx(tmp_path):
    reqs = ["GET /proxy?xar=/index.html HTTP/1.0\r\n\r\n",
            "POST /proxy?xar=/index.html HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
            "GET /dir/ HTTP/1.0\r\n\r\n"]  # fmt: skip

    def ask(port, r):
        a = exchange(port, r.encode())
        return a.status, a.body, a.headers.get("set-cookie"), a.headers.get("something")

    with side_by_side(tmp_path, CONF, {"dir/index.html": "file"}) as (srv, nginx_port):
        got = [ask(srv.port, r) for r in reqs]
        want = [ask(nginx_port, r) for r in reqs]
    assert got == want
    assert got[0] == (200, b"xar: /index.html uri: /index.html method: GET", "blah=blah", None)
    assert got[1][1].endswith(b"method: GET")
    assert got[2][1] == b"index redirect seen"


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_accel_redirect_uri_is_unescaped_and_checked_after(tmp_path):
    # `$arg_xar` is not decoded: the application sends the escapes as they are. nginx decodes the URI, refuses
    # a `..` that only shows once decoded, and redirects to the decoded path.
    xars = ["/foo%20bar", "/foo/.%2e", "/foo/%2e%2e/x", "/./index.html", "/a%3Fb"]

    def ask(port, xar):
        a = exchange(port, f"GET /proxy?xar={xar} HTTP/1.0\r\n\r\n".encode())
        return a.status, a.body if a.status == 200 else b""

    with side_by_side(tmp_path, CONF, {"index.html": "file"}) as (srv, nginx_port):
        got = [ask(srv.port, x) for x in xars]
        want = [ask(nginx_port, x) for x in xars]
    assert got == want
    assert got[0] == (200, b"xar: /foo%20bar uri: /foo bar method: GET")
    assert got[1][0] == got[2][0] == 404
