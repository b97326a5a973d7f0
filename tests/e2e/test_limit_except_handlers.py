"""`proxy_pass` and `access_log` inside `limit_except`, on gannet and Debian's nginx with
one config: the methods the block is about are passed where its `proxy_pass` says (the
request's own URI: no URI part is allowed there) and logged in its log; the others go to
the location's `proxy_pass`.
"""

from __future__ import annotations

import subprocess

import pytest

from conftest import gannet_bin, wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    log_format m "$request_method $uri";
    server {
        listen 127.0.0.1:{port} default_server;
        location / { return 200 "uri:$uri"; }
    }
    server {
        listen 127.0.0.1:{port};
        server_name front;
        location /lx {
            proxy_pass http://127.0.0.1:{port}/replacement;
            limit_except POST {
                proxy_pass http://127.0.0.1:{port};
                access_log {tmp}/lx.log m;
            }
        }
    }
}
"""


def ask(port: int, method: str, path: str) -> bytes:
    req = f"{method} {path} HTTP/1.1\r\nHost: front\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    return exchange(port, req.encode()).body


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_proxy_pass_and_access_log_in_limit_except(tmp_path):
    calls = [("GET", "/lx/a"), ("POST", "/lx/a"), ("HEAD", "/lx/b")]
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = [ask(srv.port, *c) for c in calls]
        want = [ask(nginx_port, *c) for c in calls]
        log = tmp_path / "gannet" / "lx.log"
        assert wait_until(lambda: log.exists() and log.read_text().count("\n") >= 2)
        nlog = tmp_path / "nginx" / "lx.log"
        assert wait_until(lambda: nlog.exists() and nlog.read_text().count("\n") >= 2)
        assert log.read_text() == nlog.read_text() == "GET /lx/a\nHEAD /lx/b\n"
    assert got == want
    assert got[:2] == [b"uri:/lx/a", b"uri:/replacement/a"]


def test_no_uri_part_inside_limit_except(tmp_path):
    conf = tmp_path / "g.conf"
    conf.write_text(
        "events {}\nhttp { server { listen 127.0.0.1:1; location / {\n"
        "limit_except GET { proxy_pass http://127.0.0.1:2/x; } } } }\n"
    )
    r = subprocess.run([str(gannet_bin()), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "cannot have URI part" in r.stderr and "g.conf:3" in r.stderr, r.stderr
