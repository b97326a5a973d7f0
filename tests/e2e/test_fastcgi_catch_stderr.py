"""`fastcgi_catch_stderr` on gannet and Debian's nginx with one config and one application:
a listed string in what the application writes to stderr before its answer's head makes
the answer invalid (502); the same string after the head, or another string, does not.
"""

from __future__ import annotations

import pytest

import rawapps
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

HEAD = b"Content-Type: text/plain\r\n\r\n"


@pytest.fixture
def app():
    yield from rawapps.made(rawapps.FastCgiApp)


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_catch_stderr_as_nginx(tmp_path, app):
    answers = {
        "before": rawapps.record(7, b"PHP Fatal: sample error\n") + rawapps.stdout(HEAD + b"body"),
        "after": rawapps.stdout(HEAD + b"body") + rawapps.record(7, b"sample error\n"),
        "other": rawapps.record(7, b"just a warning\n") + rawapps.stdout(HEAD + b"body"),
    }
    ups = {k: app(lambda conn, a=a: conn.sendall(a + rawapps.end_request())) for k, a in answers.items()}
    locs = "\n".join(
        f"location /{k} {{ fastcgi_pass 127.0.0.1:{u.port}; }}" for k, u in ups.items()
    )
    conf = PEER_MAIN + r"""
http {
    access_log off;
    fastcgi_catch_stderr "nothing";
    server {
        listen 127.0.0.1:{port};
        fastcgi_catch_stderr "Fatal";
        fastcgi_catch_stderr "sample";
        %s
    }
}
""" % locs
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got = {k: exchange(srv.port, f"GET /{k} HTTP/1.0\r\n\r\n".encode()) for k in ups}
        want = {k: exchange(nginx_port, f"GET /{k} HTTP/1.0\r\n\r\n".encode()) for k in ups}
    assert {k: (a.status, a.body) for k, a in want.items()}["after"] == (200, b"body")
    assert {k: a.status for k, a in got.items()} == {k: a.status for k, a in want.items()} == {
        "before": 502, "after": 200, "other": 200}
