"""`$request_body_file` with `client_body_in_file_only off|on|clean` (the temporary file's
name in `client_body_temp_path`'s levels; `on` leaves the file, `clean` removes it after the
request, `off` unlinks it at once), also handed to an application in `proxy_set_header`;
`$upstream_cookie_NAME` from an upstream's Set-Cookie fields; `$sent_trailer_NAME` in
`add_trailer`. Against Debian's nginx with the same config, except where nginx 1.22 predates
the behaviour (several trailers of one name joined with ", ", nginx 1.23).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

import rawapps
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, dechunk, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    client_body_temp_path {tmp}/cbt 1 2;
    server {
        listen 127.0.0.1:{port};
        client_body_buffer_size 2k;
        add_header X-Body "$request_body";
        add_header X-Body-File "$request_body_file";
        location /off { proxy_pass http://127.0.0.1:APP; }
        location /on { client_body_in_file_only on; proxy_pass http://127.0.0.1:APP; }
        location /clean { client_body_in_file_only clean; proxy_pass http://127.0.0.1:APP; }
        location /name {
            client_body_in_file_only on;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-File $request_body_file;
            proxy_pass http://127.0.0.1:APP;
        }
        location /cookies {
            proxy_pass http://127.0.0.1:APP;
            add_header X-C "[$upstream_cookie_a|$upstream_cookie_B|$upstream_cookie_c|$upstream_cookie_none]";
        }
        location /trailers {
            add_trailer X-One one;
            add_trailer X-Echo "[$sent_trailer_x_one|$sent_trailer_x_later|$sent_trailer_none]";
            add_trailer X-Later later;
            return 200 "body\n";
        }
        location /multi {
            add_trailer Foo a;
            add_trailer Foo b;
            add_trailer X-Multi "$sent_trailer_foo";
            return 200 "body\n";
        }
    }
}
"""

# The name of a body file under `cbt` with levels 1 and 2, as nginx makes them.
NAME = re.compile(r"/cbt/(\d)/(\d\d)/\d{7}\2\1$")


def app_answer(conn, head, _body):
    """Echoes `X-File`'s file's content; Set-Cookie fields for /cookies."""
    cookies = "Set-Cookie: a=1; path=/\r\nSet-Cookie: b = 2 ;x\r\nSet-Cookie: cc=no\r\nSet-Cookie: c=3\r\n"
    extra = cookies if b"/cookies" in head.split(b"\r\n")[0] else ""
    body = b"TEST\n"
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"x-file:"):
            body = Path(line.split(b":", 1)[1].strip().decode()).read_bytes()
    conn.sendall(rawapps.http_answer(body, headers=extra, keep=False))


@pytest.fixture
def app():
    a = rawapps.HttpApp(app_answer)
    yield a
    a.close()


def post(port: int, path: str, body: bytes):
    req = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return exchange(port, req.encode() + body)


def files(tmp: Path) -> list[Path]:
    return sorted(p for p in (tmp / "cbt").rglob("*") if p.is_file())


def test_request_body_file_as_nginx(tmp_path, app):
    big, small = b"0123456789" * 512, b"0123456789"
    with side_by_side(tmp_path, CONF.replace("APP", str(app.port))) as (srv, nginx_port):
        for name, port, tmp in (("nginx", nginx_port, tmp_path / "nginx"), ("gannet", srv.port, srv.tmp)):
            # In memory: $request_body, no file.
            a = post(port, "/off", small)
            assert (a.status, a.headers.get("x-body"), a.headers.get("x-body-file")) == (200, "0123456789", None), name
            # Too big for the buffer: a file with a name, unlinked at once.
            a = post(port, "/off", big)
            assert "x-body" not in a.headers and NAME.search(a.headers["x-body-file"]), (name, a.headers)
            assert not Path(a.headers["x-body-file"]).exists() and files(tmp) == [], name
            # `on`: every body in a file that stays.
            a = post(port, "/on", small)
            kept = Path(a.headers["x-body-file"])
            assert NAME.search(str(kept)) and "x-body" not in a.headers, (name, a.headers)
            assert wait_until(lambda: files(tmp) == [kept]) and kept.read_bytes() == small, name
            kept.unlink()
            # An empty (chunked) body still gets its empty file.
            a = exchange(port, b"POST /on HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                         b"Connection: close\r\n\r\n0\r\n\r\n")
            empty = Path(a.headers["x-body-file"])
            assert wait_until(lambda: files(tmp) == [empty]) and empty.read_bytes() == b"", name
            empty.unlink()
            # `clean`: a file while the request runs, removed after it.
            a = post(port, "/clean", big)
            assert NAME.search(a.headers["x-body-file"]), (name, a.headers)
            assert wait_until(lambda: files(tmp) == []), name
            # The name handed to the application, which reads the body from it.
            a = post(port, "/name", big)
            assert a.body == big, name
            for f in files(tmp):
                f.unlink()


def test_upstream_cookie_as_nginx(tmp_path, app):
    with side_by_side(tmp_path, CONF.replace("APP", str(app.port))) as (srv, nginx_port):
        got = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            a = exchange(port, b"GET /cookies HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            got[name] = (a.status, a.headers.get("x-c"))
    assert got["gannet"] == got["nginx"] == (200, "[1|2 |3|]")


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def trailers(raw_answer: bytes) -> list[str]:
    body = raw_answer.partition(b"\r\n\r\n")[2]
    assert dechunk(body) == b"body\n"
    return body.partition(b"\r\n0\r\n")[2].decode().split("\r\n")[:-2]


def test_sent_trailer_as_nginx(tmp_path, app):
    req = b"GET /trailers HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    with side_by_side(tmp_path, CONF.replace("APP", str(app.port))) as (srv, nginx_port):
        g, n = trailers(raw(srv.port, req)), trailers(raw(nginx_port, req))
        assert g == n == ["X-One: one", "X-Echo: [one||]", "X-Later: later"]
        # Several of one name: joined, as nginx 1.23 and later (1.22 gave the first).
        multi = trailers(raw(srv.port, b"GET /multi HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"))
        assert multi == ["Foo: a", "Foo: b", "X-Multi: a, b"]
