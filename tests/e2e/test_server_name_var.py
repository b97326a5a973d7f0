"""`$server_name` and the server a request without Host goes to, on gannet and Debian's
nginx with one config: the first name as nginx keeps it (a regex as written, `.name`
without its dot, lower case), and `server_name ""` taking requests that name no host.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server { listen 127.0.0.1:{port}; server_name Localhost; return 200 "[$server_name]"; }
    server { listen 127.0.0.1:{port}; server_name other ""; return 200 "[$server_name]"; }
    server { listen 127.0.0.1:{port}; server_name ~^EXAMPLE\.COM$; return 200 "[$server_name]"; }
    server { listen 127.0.0.1:{port}; server_name .Dot.example.com; return 200 "[$server_name]"; }
    server { listen 127.0.0.1:{port}; server_name *.Star.example.com; return 200 "[$server_name]"; }
}
"""

HOSTS = [None, "", "xxx", "localhost", "other", "example.com", "EXAMPLE.COM", "dot.example.com",
         "a.dot.example.com", "b.star.example.com"]  # fmt: skip


def ask(port: int, host: str | None) -> bytes:
    h = "" if host is None else f"Host: {host}\r\n"
    return exchange(port, f"GET / HTTP/1.0\r\n{h}\r\n".encode()).body.split(b"<hr>")[0]


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_server_name_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = {h: ask(srv.port, h) for h in HOSTS}
        want = {h: ask(nginx_port, h) for h in HOSTS}
    assert got == want
    assert got[None] == b"[other]" and got["xxx"] == b"[localhost]"
    assert got["example.com"] == b"[~^EXAMPLE\\.COM$]" and got["dot.example.com"] == b"[dot.example.com]"


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_server_without_name_takes_no_host(tmp_path):
    conf = PEER_MAIN + r"""
http {
    access_log off;
    server { listen 127.0.0.1:{port} default_server; server_name a; return 200 "a"; }
    server { listen 127.0.0.1:{port}; return 200 "nameless"; }
}
"""
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got = [ask(srv.port, h) for h in (None, "x")]
        want = [ask(nginx_port, h) for h in (None, "x")]
    assert got == want == [b"nameless", b"a"]
