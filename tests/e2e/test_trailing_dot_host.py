"""A host with a trailing dot names the same virtual host as without it (nginx's
ngx_http_validate_host drops the dot) whichever way it comes: an HTTP/1 Host header, an
HTTP/1 absolute-form target, an HTTP/2 `:authority`; on gannet and Debian's nginx with
one config.
"""

from __future__ import annotations

import subprocess

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

SERVERS = r"""
    server { listen 127.0.0.1:{port} LISTEN; return 200 "default $server_name $host\n"; }
    server {
        listen 127.0.0.1:{port} LISTEN;
        server_name example.com;
        return 200 "named $server_name $host\n";
    }
"""


def conf(listen: str) -> str:
    return PEER_MAIN + "http {\n    access_log off;\n" + SERVERS.replace("LISTEN", listen) + "}\n"


def h1(port: int, target: str, host: str) -> tuple[int, bytes]:
    a = exchange(port, f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    return a.status, a.body


def h2(port: int, host: str) -> tuple[str, bytes]:
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-H", f"Host: {host}", "-w", "%{http_code} %{http_version}",
                        "-o", "-", f"http://127.0.0.1:{port}/"], capture_output=True, timeout=10)  # fmt: skip
    return r.stdout.decode()[-5:], r.stdout[:-5]


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_trailing_dot_host_over_http1_as_nginx(tmp_path):
    asks = [("/", "example.com."), ("http://example.com./", "other"), ("http://EXAMPLE.com./x", "other"),
            ("/", "example.com"), ("/", "other.")]  # fmt: skip
    with side_by_side(tmp_path, conf("")) as (srv, nginx_port):
        got = [h1(srv.port, t, h) for t, h in asks]
        want = [h1(nginx_port, t, h) for t, h in asks]
    assert got == want
    assert got[0] == got[1] == got[2] == (200, b"named example.com example.com\n")


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_trailing_dot_authority_over_http2_as_nginx(tmp_path):
    hosts = ["example.com.", "Example.COM.", "example.com", "other."]
    with side_by_side(tmp_path, conf("http2")) as (srv, nginx_port):
        got = [h2(srv.port, h) for h in hosts]
        want = [h2(nginx_port, h) for h in hosts]
    assert got == want
    assert got[0] == got[1] == ("200 2", b"named example.com example.com\n")
