"""Upstream rules nginx's test suite checks, against Debian's nginx with the same config:
failures counted among successes (`max_fails`), implicit groups of the addresses a
`proxy_pass` name resolves to (found by a `proxy_pass` with variables too), an intercepted
401 keeping its WWW-Authenticate, the times logged for a client that leaves while the
upstream thinks, and `proxy_buffer_size` below a page.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import rawapps
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")


@pytest.fixture
def app():
    yield from rawapps.made(rawapps.HttpApp)


def get(port: int, path: str):
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())


def flaky(port_name: str):
    """An application that closes every third connection unanswered."""
    count = {"n": 0}
    lock = threading.Lock()

    def behave(conn, head, body):
        with lock:
            count["n"] += 1
            n = count["n"]
        if n % 3 == 0:
            return None
        conn.sendall(rawapps.http_answer(b"OK\n", headers=f"X-Port: {port_name}\r\n", keep=False))
        return None

    return behave


def steady(port_name: str):
    def behave(conn, head, body):
        conn.sendall(rawapps.http_answer(b"OK\n", headers=f"X-Port: {port_name}\r\n", keep=False))

    return behave


FAILS_CONF = PEER_MAIN + r"""
http {
    upstream u {
        server 127.0.0.1:A_PORT max_fails=3 fail_timeout=10s;
        server 127.0.0.1:B_PORT max_fails=3 fail_timeout=10s;
    }
    server {
        listen 127.0.0.1:{port};
        location / { proxy_pass http://u; }
    }
}
"""


def test_failures_among_successes_take_a_server_out_as_nginx(tmp_path, app):
    # The first server drops every third connection; the request goes on to the second.
    # nginx counts the three failures though successes come between them, and takes the
    # server out after its sixth success (nginx-tests' upstream.t).
    counts = {}
    for name in ("nginx", "gannet"):
        a, b = app(flaky("a")), app(steady("b"))
        conf = FAILS_CONF.replace("A_PORT", str(a.port)).replace("B_PORT", str(b.port))
        (tmp_path / name).mkdir()
        with side_by_side(tmp_path / name, conf) as (srv, nginx_port):
            port = nginx_port if name == "nginx" else srv.port
            seen = {"a": 0, "b": 0}
            for _ in range(30):
                r = get(port, "/")
                assert r.status == 200
                seen[r.headers["x-port"]] += 1
            counts[name] = seen
    assert counts["gannet"] == counts["nginx"] == {"a": 6, "b": 24}


IMPLICIT_CONF = PEER_MAIN + r"""
http {
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://localhost:APP_PORT/stub;
            add_header X-Addr $upstream_addr always;
        }
        location /var {
            proxy_pass http://$arg_b/stub;
            add_header X-Addr $upstream_addr always;
        }
    }
}
"""


def test_a_named_proxy_pass_is_an_implicit_group_as_nginx(tmp_path, app):
    # `localhost` resolves when the config is loaded; `$upstream_addr` names the address,
    # and a `proxy_pass` with variables whose value names the same host and port takes that
    # group without a resolver (nginx: "no resolver defined" otherwise, a 502).
    backend = app(lambda conn, head, body: conn.sendall(rawapps.http_answer(b"stub\n", "404 Not Found", keep=False)))
    conf = IMPLICIT_CONF.replace("APP_PORT", str(backend.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            plain, var = get(port, "/"), get(port, f"/var?b=localhost:{backend.port}")
            got[name] = [(r.status, r.headers.get("x-addr")) for r in (plain, var)]
    assert got["gannet"] == got["nginx"] == [(404, f"127.0.0.1:{backend.port}")] * 2


INTERCEPT_CONF = PEER_MAIN + r"""
http {
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:APP_PORT;
            proxy_intercept_errors on;
            error_page 401 /intercepted;
        }
        location = /intercepted { return 200 "intercepted\n"; }
    }
}
"""


def test_an_intercepted_401_keeps_its_challenge_as_nginx(tmp_path, app):
    def behave(conn, head, body):
        conn.sendall(rawapps.http_answer(b"no\n", "401 Unauthorized", "WWW-Authenticate: Basic realm=\"x\"\r\n", keep=False))

    backend = app(behave)
    with side_by_side(tmp_path, INTERCEPT_CONF.replace("APP_PORT", str(backend.port))) as (srv, nginx_port):
        n, g = get(nginx_port, "/auth"), get(srv.port, "/auth")
    assert (g.status, g.headers.get("www-authenticate"), g.body) == (n.status, n.headers.get("www-authenticate"), n.body)
    assert (g.status, g.headers.get("www-authenticate"), g.body) == (401, 'Basic realm="x"', b"intercepted\n")


CLOSE_CONF = PEER_MAIN + r"""
http {
    log_format time '$upstream_addr $upstream_connect_time:$upstream_header_time:$upstream_response_time';
    server {
        listen 127.0.0.1:{port};
        location / { proxy_pass http://127.0.0.1:APP_PORT; access_log {tmp}/time.log time; }
    }
}
"""


def test_a_client_that_leaves_is_logged_with_its_upstream_times_as_nginx(tmp_path, app):
    # The application never answers; the client leaves after a moment. nginx logs the
    # attempt with its connect time, no header time, and its time until then.
    hold = threading.Event()
    backend = app(lambda conn, head, body: hold.wait(10))
    lines = {}
    try:
        with side_by_side(tmp_path, CLOSE_CONF.replace("APP_PORT", str(backend.port))) as (srv, nginx_port):
            for name, port, tmp in (("nginx", nginx_port, tmp_path / "nginx"), ("gannet", srv.port, srv.tmp)):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                wait_until(lambda: len(backend.requests) >= (1 if name == "nginx" else 2))
                time.sleep(0.3)  # the time the test measures, not a synchronisation
                s.close()
                log = tmp / "time.log"
                lines[name] = wait_until(lambda: log.exists() and log.read_text().strip()).split()
    finally:
        hold.set()
    for name, (addr, times) in lines.items():
        connect, header, response = times.split(":")
        assert addr == f"127.0.0.1:{backend.port}", name
        assert header == "-", name
        assert float(connect) < 0.3 <= float(response) + 0.05, (name, times)


def test_a_small_proxy_buffer_size_is_taken_as_nginx(tmp_path):
    n, g = check_both(tmp_path, "proxy_buffer_size 128; proxy_buffers 4 128;")
    assert n.returncode == 0, n.stderr
    assert g.returncode == 0, g.stderr


LIMIT_CONF = PEER_MAIN + r"""
http {
    limit_conn_zone $binary_remote_addr zone=one:1m;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /slow { proxy_pass http://127.0.0.1:APP_PORT; limit_conn one 1; }
        location /1 { limit_conn one 1; }
    }
}
"""


def test_a_client_that_leaves_gives_its_limit_conn_count_back_at_once_as_nginx(tmp_path, app):
    # The client leaves while the application thinks; the next request, made at once,
    # finds its count given back (nginx-tests' limit_conn.t).
    hold = threading.Event()
    backend = app(lambda conn, head, body: hold.wait(10))
    got = {}
    try:
        conf = LIMIT_CONF.replace("APP_PORT", str(backend.port))
        with side_by_side(tmp_path, conf, {"1": b"passed\n"}) as (srv, nginx_port):
            for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
                before = len(backend.requests)
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
                wait_until(lambda: len(backend.requests) > before)
                held = get(port, "/1").status
                s.close()
                released = wait_until(lambda: get(port, "/1").status == 200, deadline=0.1)
                got[name] = (held, bool(released))
    finally:
        hold.set()
    assert got["gannet"] == got["nginx"] == (503, True)
