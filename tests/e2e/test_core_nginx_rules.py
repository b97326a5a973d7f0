"""Request rules nginx's test suite checks, against Debian's nginx with the same config:
TRACE and CONNECT refused 405 (the connection closed), an `auth_basic_user_file` starting
with a variable put under the prefix, an alias inherited by a nested regex location, one
`$request_id` for a request and its SSI subrequest, `mirror` once per location a request
goes through, and a head over `max_headers`.
"""

from __future__ import annotations

import socket

import pytest
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

CONF = PEER_MAIN + r"""
http {
    log_format uri $uri;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location / { return 200 "ok\n"; }
        location /auth/ {
            auth_basic "x";
            auth_basic_user_file $arg_f;
            alias {root}/;
        }
        location /nested/ {
            alias {root}/dir/;
            location ~ \.txt$ { }
        }
        location /ssi/ { ssi on; add_header X-Id $request_id; }
        location /id { return 200 $request_id; }
        location /m/ { mirror /mirror; index index.html; }
        location /mirror { log_subrequest on; access_log {tmp}/mirror.log uri; return 204; }
    }
}
"""

FILES = {
    # apr1 of "password" with salt "salt", as htpasswd writes it.
    "htpasswd": "u:$apr1$salt$Xxd1irWT9ycqoYxGFn4cb.\n",
    "index.html": "SEE-THIS\n",
    "dir/a.txt": "nested\n",
    "ssi/page.html": '<!--#include virtual="/id" -->',
    "m/index.html": "mirrored\n",
}


def raw(port: int, data: bytes) -> tuple[bytes, bool]:
    """The answer to `data` on a kept-alive request, and whether the server then closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        head, _, body = got.partition(b"\r\n\r\n")
        length = int(next(v for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")) if k.lower() == b"content-length"))
        while len(body) < length:
            body += s.recv(65536)
        try:
            s.settimeout(2)
            closed = s.recv(1) == b""
        except socket.timeout:
            closed = False
        return head.split(b"\r\n")[0], closed


def get(port: int, path: str, extra: str = ""):
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode())


def test_request_rules_as_nginx(tmp_path):
    auth = "Authorization: Basic dTpwYXNzd29yZA==\r\n"
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        got = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            trace = raw(port, b"TRACE / HTTP/1.1\r\nHost: t\r\n\r\n")
            connect = raw(port, b"CONNECT / HTTP/1.1\r\nHost: t\r\n\r\n")
            # Relative to each server's prefix (gannet's is its config's folder, next to the
            # shared document root; nginx's is its own folder beside it).
            found = get(port, "/auth/?f=../gannet/www/htpasswd", auth)
            missing = get(port, "/auth/?f=nx", auth)
            nested = get(port, "/nested/a.txt")
            ssi = get(port, "/ssi/page.html")
            got[name] = {
                "trace": trace,
                "connect": connect,
                "auth": (found.status, found.body, missing.status),
                "nested": (nested.status, nested.body),
                "ssi same id": ssi.headers.get("x-id", "").encode() == ssi.body,
            }
    assert got["gannet"] == got["nginx"]
    g = got["gannet"]
    assert g["trace"] == (b"HTTP/1.1 405 Not Allowed", True)
    assert g["auth"] == (200, b"SEE-THIS\n", 403)
    assert g["nested"] == (200, b"nested\n")
    assert g["ssi same id"] is True


def test_mirror_once_per_location_as_nginx(tmp_path):
    # /m/ mirrors, then its index sends the request on to /m/index.html, in the same
    # location: mirrored again (nginx's precontent phase runs in each).
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        logs = {}
        for name, port, tmp in (("nginx", nginx_port, tmp_path / "nginx"), ("gannet", srv.port, srv.tmp)):
            assert get(port, "/m/").status == 200
            log = tmp / "mirror.log"
            logs[name] = wait_until(lambda: log.exists() and log.read_text().count("\n") >= 2 and log.read_text())
    assert logs["gannet"] == logs["nginx"] == "/mirror\n/mirror\n"


MAX_CONF = PEER_MAIN + r"""
http {
    server {
        listen 127.0.0.1:{port};
        max_headers 3;
        location / { return 200 "ok\n"; }
    }
}
"""


def test_too_many_headers_answered_as_nginx(tmp_path):
    extra = "".join(f"X-{i}: {i}\r\n" for i in range(5))
    with side_by_side(tmp_path, MAX_CONF) as (srv, nginx_port):
        n, g = get(nginx_port, "/", extra), get(srv.port, "/", extra)
    norm = lambda a: (a.status, a.body.replace(b"gannet/0.1.0", b"SERVER").replace(b"nginx/1.22.1", b"SERVER"))  # noqa: E731
    assert norm(g) == norm(n)
    assert g.status == 400 and b"Request Header Or Cookie Too Large" in g.body
