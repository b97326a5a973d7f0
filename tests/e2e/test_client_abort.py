"""A client that leaves while the application is still working: with
`proxy_ignore_client_abort off` (the default) the proxy closes its upstream connection at
once and logs 499; with `on` it waits for the answer. Compared with Debian's nginx on one
config: what the application saw (its connection closed, or it got to answer) and the
access-log lines. Over HTTP/1.1 (the client closes its socket) and HTTP/2 (curl gives up).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading

import pytest

import rawapps
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    log_format abort '$uri $status $body_bytes_sent';
    access_log {tmp}/access.log abort;
    server {
        listen 127.0.0.1:{port};
        location /abort/ { proxy_pass http://127.0.0.1:APP; }
        location /ignore/ { proxy_pass http://127.0.0.1:APP; proxy_ignore_client_abort on; }
    }
}
"""


class App:
    """Holds each request for up to `hold` seconds: if the proxy closes its connection
    meanwhile, notes "closed"; else answers and notes "answered"."""

    def __init__(self, hold: float = 2.0):
        self.hold = hold
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.http = rawapps.HttpApp(self.behave)

    def behave(self, conn, head, body):
        path = head.split(b" ")[1].decode()
        conn.settimeout(self.hold)
        try:
            got = conn.recv(1)
            outcome = "closed" if got == b"" else "data"
        except socket.timeout:
            conn.sendall(rawapps.http_answer(b"late\n", keep=False))
            outcome = "answered"
        with self.lock:
            self.seen.append((path, outcome))


def leave_early(port: int, path: str, app: App) -> None:
    """Send a request, wait until the application has it, then close the connection."""
    before = len(app.http.requests)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    wait_until(lambda: len(app.http.requests) > before)
    s.close()


def outcome(app: App, n: int) -> str:
    wait_until(lambda: len(app.seen) >= n, deadline=app.hold + 3)
    return app.seen[n - 1][1]


def test_a_client_that_leaves_ends_the_exchange_as_in_nginx(tmp_path):
    app = App()
    conf = CONF.replace("APP", str(app.http.port))
    try:
        with side_by_side(tmp_path, conf) as (srv, nginx_port):
            results = {}
            for name, port in (("gannet", srv.port), ("nginx", nginx_port)):
                n = len(app.seen)
                leave_early(port, "/abort/x", app)
                first = outcome(app, n + 1)
                leave_early(port, "/ignore/x", app)
                second = outcome(app, n + 2)
                results[name] = (first, second)
            assert results["gannet"] == results["nginx"] == ("closed", "answered"), results
            srv.stop()
        ours = (srv.tmp / "access.log").read_text().splitlines()
        theirs = (tmp_path / "nginx" / "access.log").read_text().splitlines()
        assert ours == theirs, (ours, theirs)
        assert ours[0] == "/abort/x 499 0"
    finally:
        app.http.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_an_http2_client_that_leaves_ends_the_exchange(gannet):
    app = App()
    conf = CONF.replace("APP", str(app.http.port)).replace("listen 127.0.0.1:{port};", "listen 127.0.0.1:{port} http2;")
    try:
        srv = gannet.start(conf=conf)
        for path, expected in (("/abort/h2", "closed"), ("/ignore/h2", "answered")):
            n = len(app.seen)
            # curl gives up after a second, before the application answers.
            subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-m", "1", f"http://127.0.0.1:{srv.port}{path}"], capture_output=True, timeout=10)
            assert outcome(app, n + 1) == expected, path
        srv.stop()
        assert srv.access_log().splitlines()[0] == "/abort/h2 499 0"
    finally:
        app.http.close()
