"""Upstream answers and client addresses where gannet once answered differently from nginx,
checked side by side with Debian's nginx on the same config:

- `geo` without an address variable for a `listen unix:` client: no address, so the
  255.255.255.255 entry (or the default) applies, for net and `ranges` tables alike;
- `proxy_redirect` whose first argument holds variables;
- "no live upstreams": nginx lists the group's name in `$upstream_addr`, after the servers
  that were tried.
"""

from __future__ import annotations

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

GEO = PEER_MAIN + r"""
http {
    access_log off;
    root {root};
    geo $g { default default; 255.255.255.255 none; }
    geo $gr { ranges; 0.0.0.0-255.255.255.254 low; default none; }
    geo $remote_addr $ga { default default; 255.255.255.255 none; }
    server {
        listen unix:{tmp}/geo.sock;
        location / { return 200 "g=$g gr=$gr ga=$ga\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        location / { proxy_pass http://unix:{tmp}/geo.sock; }
        location /tcp { return 200 "g=$g gr=$gr ga=$ga\n"; }
    }
}
"""


def test_geo_of_unix_client_is_the_no_address_entry(tmp_path):
    def ask(port):
        return [exchange(port, f"GET {u} HTTP/1.0\r\n\r\n".encode()).body for u in ("/", "/tcp")]

    with side_by_side(tmp_path, GEO) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    assert got == [b"g=none gr=none ga=none\n", b"g=default gr=low ga=default\n"]


REDIRECT = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location / {
            set $part var_here;
            proxy_pass http://127.0.0.1:{port}/answer;
            proxy_redirect http://127.0.0.1:{port}/$part/ /replaced/;
        }
        location /answer {
            add_header Refresh "7; url=http://127.0.0.1:{port}/$arg_to/page.html";
            return 302 http://127.0.0.1:{port}/$arg_to/page.html;
        }
    }
}
"""


def test_proxy_redirect_with_variables_in_the_first_argument(tmp_path):
    def ask(port):
        out = []
        for to in ("var_here", "elsewhere"):
            a = exchange(port, f"GET /x?to={to} HTTP/1.0\r\n\r\n".encode())
            out.append((a.status, a.headers.get("location", "").replace(str(port), "P"),
                        a.headers.get("refresh", "").replace(str(port), "P")))  # fmt: skip
        return out

    with side_by_side(tmp_path, REDIRECT) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    assert got[0] == (302, "http://127.0.0.1:P/replaced/page.html", "7; url=/replaced/page.html")
    assert got[1][1] == "http://127.0.0.1:P/elsewhere/page.html"


NO_LIVE = PEER_MAIN + r"""
http {
    access_log off;
    upstream bad {
        server 127.0.0.1:{port};
        server 127.0.0.1:1;
    }
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://bad/closes;
            add_header X-Addr $upstream_addr always;
            add_header X-Status $upstream_status always;
        }
        location /closes { return 444; }
    }
}
"""


def test_no_live_upstreams_names_the_group(tmp_path):
    def ask(port):
        out = []
        for _ in range(2):
            a = exchange(port, b"GET / HTTP/1.0\r\n\r\n")
            addr = re.sub(rf":{port}\b", ":P", a.headers.get("x-addr", ""))
            out.append((a.status, addr, a.headers.get("x-status")))
        return out

    with side_by_side(tmp_path, NO_LIVE) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    # Both servers failed the first time (and are down for fail_timeout): the second
    # request has no server to try.
    assert got[1] == (502, "bad", "502")
