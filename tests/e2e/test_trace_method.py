"""TRACE is refused with 405 before any location runs (nginx's ngx_http_process_request_header),
over HTTP/1.1 and HTTP/2, side by side with Debian's nginx on one config; other methods reach
the location.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

# Debian's 1.22 speaks only prior-knowledge HTTP/2 on a cleartext `http2` listen: HTTP/1.1
# is asked on a listen of its own.
CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port}%s;
        location / { return 200 "reached $request_method\n"; }
    }
}
"""


def h1(port: int, method: str) -> tuple[int, bytes]:
    a = exchange(port, f"{method} /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    # An error page names its server: only the location's own answers are compared whole.
    return a.status, a.body if a.status == 200 else b""


def h2(port: int, method: str) -> str:
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-X", method, "-o", "/dev/null",
                        "-w", "%{http_version} %{http_code}", f"http://127.0.0.1:{port}/x"],
                       capture_output=True, text=True, timeout=10)
    return r.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_trace_refused_as_nginx(tmp_path):
    methods = ("TRACE", "GET", "DELETE")
    (tmp_path / "h1").mkdir()
    (tmp_path / "h2").mkdir()
    with side_by_side(tmp_path / "h1", CONF % "") as (srv, nginx_port):
        got = {m: h1(srv.port, m) for m in methods}
        want = {m: h1(nginx_port, m) for m in methods}
        log = srv.error_log()
    with side_by_side(tmp_path / "h2", CONF % " http2") as (srv, nginx_port):
        got.update({f"h2 {m}": h2(srv.port, m) for m in methods})
        want.update({f"h2 {m}": h2(nginx_port, m) for m in methods})
    assert got == want
    assert got["TRACE"][0] == 405 and got["h2 TRACE"] == "2 405"
    assert got["GET"] == (200, b"reached GET\n") and got["h2 GET"] == "2 200"
    assert "client sent TRACE method" in log
