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
