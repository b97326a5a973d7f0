"""`$upstream_connect_time`, `$upstream_header_time`, `$upstream_http_NAME`, `$request_id` and
`$http2` in log_format, add_header, return and map, against Debian's nginx: the same config
proxying to the same application (and to a closed port first, for the lists across tries),
answers and access-log lines compared with the times' digits blanked.
"""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

import rawapps
from conftest import free_port, wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    log_format up '$arg_i|$upstream_addr|$upstream_status|$upstream_connect_time|$upstream_header_time|$upstream_response_time|$upstream_http_x_app|$upstream_http_x_missing|$upstream_http_content_type|[$http2]|$app_class';
    access_log {tmp}/up.log up;
    log_format ids '$arg_i $request_id';
    map $upstream_http_x_app $app_class { default other; ~^alpha alpha-class; "" none; }
    upstream pair { server 127.0.0.1:DEAD; server 127.0.0.1:APP; }
    server {
        listen 127.0.0.1:{port};
        location /p/ {
            proxy_pass http://127.0.0.1:APP;
            add_header X-Class $app_class;
            add_header X-Up "$upstream_http_x_app|$upstream_status|$upstream_http_content_type";
        }
        location /two/ { proxy_pass http://pair; add_header X-Up "$upstream_http_x_app|$upstream_status"; }
        location = /none { return 200 "[$upstream_http_x_app|$upstream_connect_time|$upstream_header_time|$http2]\n"; }
        location = /id {
            access_log {tmp}/ids.log ids;
            add_header X-Id $request_id;
            return 200 "$request_id\n";
        }
    }
}
"""


def app_answer(conn, head, _body):
    """`X-App` is the request's last path segment; no X-App for `/p/bare`."""
    target = head.split(b" ")[1].decode().split("?")[0]
    name = target.rsplit("/", 1)[1]
    extra = "" if name == "bare" else f"X-App: {name} \"q\"\r\n"
    conn.sendall(rawapps.http_answer(b"app\n", headers=extra + "Content-Type: image/png\r\n", keep=False))


@pytest.fixture
def app():
    a = rawapps.HttpApp(app_answer)
    yield a
    a.close()


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


TIME = re.compile(r"\b\d+\.\d{3}\b")


def log_lines(path, n: int) -> list[str]:
    got = wait_until(lambda: path.exists() and len(path.read_text().splitlines()) >= n and path.read_text().splitlines())
    assert got, f"{path}: fewer than {n} lines"
    return sorted(got, key=lambda line: int(line.split("|")[0].split()[0]))


def test_upstream_variables_match_nginx(tmp_path, app):
    dead = closed_port()
    conf = CONF.replace("DEAD", str(dead)).replace("APP", str(app.port))
    paths = ["/p/alpha?i=0", "/p/beta?i=1", "/p/bare?i=2", "/two/alpha?i=3", "/none?i=4"]
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        answers = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            answers[name] = []
            for p in paths:
                a = exchange(port, f"GET {p} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
                answers[name].append((a.status, a.headers.get("x-class"), a.headers.get("x-up"), a.body))
        logs = {
            "nginx": log_lines(tmp_path / "nginx" / "up.log", len(paths)),
            "gannet": log_lines(srv.tmp / "up.log", len(paths)),
        }
    assert answers["gannet"] == answers["nginx"]
    blank = {name: [TIME.sub("T", line) for line in lines] for name, lines in logs.items()}
    assert blank["gannet"] == blank["nginx"]
    # Not vacuous: the times are there, and "-" for the try that never connected.
    assert f"|127.0.0.1:{dead}, 127.0.0.1:{app.port}|502, 200|-, T|-, T|T, T|alpha" in blank["nginx"][3].replace(
        str(nginx_port), "")
    assert "|alpha-class" in blank["nginx"][0] and answers["nginx"][0][1] == "alpha-class"


def test_request_id(tmp_path):
    with side_by_side(tmp_path, CONF.replace("DEAD", "1").replace("APP", "1")) as (srv, nginx_port):
        seen = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            ids = []
            for i in range(3):
                a = exchange(port, f"GET /id?i={i} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
                body = a.body.decode().strip()
                # The same value all along the request: the header, the body, the log line.
                assert re.fullmatch(r"[0-9a-f]{32}", body), (name, body)
                assert a.headers["x-id"] == body
                ids.append(body)
            assert len(set(ids)) == 3
            log = srv.tmp / "ids.log" if name == "gannet" else tmp_path / "nginx" / "ids.log"
            lines = log_lines(log, 3)
            assert [line.split()[1] for line in lines] == ids
            seen[name] = ids


CACHE_STATUS = PEER_MAIN + r"""
http {
    log_format cs '$upstream_cache_status|"$upstream_cache_status"|$uri';
    access_log {tmp}/access.log cs;
    server {
        listen 127.0.0.1:{port};
        location / { return 200 "[$upstream_cache_status]\n"; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_upstream_cache_status_is_not_found_as_without_proxy_cache(tmp_path):
    """No cache: the variable is defined (the config loads) and "not found", logged `-`."""
    with side_by_side(tmp_path, CACHE_STATUS) as (g, nginx_port):
        for port in (g.port, nginx_port):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /x HTTP/1.0\r\n\r\n")
                raw = b""
                while chunk := s.recv(65536):
                    raw += chunk
            assert raw.endswith(b"\r\n\r\n[]\n"), raw
        logs = [(tmp_path / side / "access.log") for side in ("gannet", "nginx")]
        assert wait_until(lambda: all(p.exists() and p.read_text() for p in logs))
        assert [p.read_text() for p in logs] == ['-|"-"|/x\n'] * 2


def test_response_time_covers_the_body(gannet):
    # The application sends its head, then its body only once the client has had the head
    # and half a second has passed: $upstream_response_time runs to the body's end (as
    # nginx's), $upstream_header_time stops at the head.
    got_head = threading.Event()

    def slow_body(conn, _head, _body):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
        # Longer than the client waits: a head held back until the body fails the test.
        got_head.wait(10)
        conn.sendall(b"body\n")

    app = rawapps.HttpApp(slow_body)
    try:
        srv = gannet.start(
            http="log_format t '$upstream_header_time $upstream_response_time';",
            server=f"location / {{ proxy_pass http://127.0.0.1:{app.port}; proxy_buffering off;"
            f" access_log {gannet.tmp}/t.log t; }}",
        )
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(4096)
            # A measured gap (the quantity under test), not a wait for some state.
            time.sleep(0.5)
            got_head.set()
            while chunk := s.recv(4096):
                data += chunk
        assert data.endswith(b"body\n")
        log = srv.tmp / "t.log"
        assert wait_until(lambda: log.exists() and log.read_text().strip())
        header, total = map(float, log.read_text().split())
        # (The times are read from the worker's clock, cached per event-loop turn: a few ms
        # of slack on the measured gap.)
        assert header < 0.5 and total >= 0.49, (header, total)
    finally:
        app.close()
