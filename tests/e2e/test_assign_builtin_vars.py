"""Assigning built-in variables, on gannet and Debian's nginx with one config: `set` of a
prefixed one (`$http_NAME`, `$arg_NAME`) is read back where the request ran the `set`, and is
the header/argument elsewhere; `set $args` and `auth_request_set $args` change the query string
passed on (the client's raw URI is then not);
and `return` with a text takes the type of the URI's extension, as nginx's.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    types { text/html html; }
    server {
        listen 127.0.0.1:{port};
        location /set {
            set $http_foo "set-$http_foo";
            set $arg_a "A";
            return 200 "[$http_foo][$arg_a][$http_bar]";
        }
        location /other {
            set $http_bar "never-read-here";
            return 200 "[$http_foo]";
        }
        location /plain { return 200 "[$http_bar][$arg_a]"; }
        location /auth {
            auth_request /ok;
            auth_request_set $args "from=auth";
            auth_request_set $http_baz "z";
            # `return` would answer in the rewrite phase, before the access phase.
            root {root};
            add_header X-V "[$args][$arg_from][$http_baz]";
        }
        location = /ok { return 204; }
        # Assigning `$args` drops the client's raw URI: a proxy_pass without a URI part
        # sends the URI with the new arguments (the hop back answers with what it got).
        location /pass/ {
            if ($http_x_hop) { return 200 "$request_uri"; }
            set $args $arg_c;
            proxy_set_header X-Hop 1;
            proxy_pass http://127.0.0.1:{port};
        }
        location /authpass/ {
            if ($http_x_hop) { return 200 "$request_uri"; }
            auth_request /ok;
            auth_request_set $args "from=auth";
            proxy_set_header X-Hop 1;
            proxy_pass http://127.0.0.1:{port};
        }
    }
}
"""


def get(port: int, path: str) -> tuple[int, str, bytes, str]:
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nFoo: f\r\nBar: b\r\nConnection: close\r\n\r\n".encode())
    return a.status, a.headers.get("content-type", ""), a.body, a.headers.get("x-v", "")


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_assigned_builtin_variables_as_nginx(tmp_path):
    paths = ["/set", "/set.html?a=1", "/other", "/plain?a=1", "/plain.html", "/auth?x=1",
             "/pass/a%20b?c=1&f", "/pass/x?f", "/authpass/y?x=1"]
    with side_by_side(tmp_path, CONF, {"auth": "file"}) as (srv, nginx_port):
        got = {p: get(srv.port, p) for p in paths}
        want = {p: get(nginx_port, p) for p in paths}
    assert got == want
    assert got["/set"][2] == b"[set-f][A][b]"
    assert got["/plain?a=1"][2] == b"[b][1]"
    assert got["/set.html?a=1"][1] == "text/html" and got["/set"][1] == "text/plain"
    assert got["/auth?x=1"][3] == "[from=auth][auth][z]"
    assert got["/pass/a%20b?c=1&f"][2] == b"/pass/a%20b?1"
    assert got["/pass/x?f"][2] == b"/pass/x"
    assert got["/authpass/y?x=1"][2] == b"/authpass/y?from=auth"
