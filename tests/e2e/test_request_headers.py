"""`underscores_in_headers` and `ignore_invalid_headers`, as a proxied upstream sees them: by
default a header whose name has `_` or another character outside `[A-Za-z0-9-]` is left out
(and logged at info as `client sent invalid header line`), `underscores_in_headers on`
keeps the underscores, `ignore_invalid_headers off` keeps them all. Checked against Debian's
nginx over HTTP/1.1, and over HTTP/2 (h2c) where the same policy applies.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side
from rawapps import HttpApp, http_answer

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

SENT = [("X_Under", "u"), ("X.Dot", "d"), ("X-Ok", "ok"), ("X~Tilde", "t")]


@pytest.fixture
def upstream():
    """Answers with the names of the request headers it received, one per line, lowercased."""

    def echo(conn, head, body):
        names = [ln.split(b":", 1)[0].lower() for ln in head.split(b"\r\n")[1:]]
        conn.sendall(http_answer(b"\n".join(sorted(names)) + b"\n"))
        return "again"

    app = HttpApp(echo)
    yield app
    app.close()


def conf(upstream_port: int, policy: str, listen: str = "") -> str:
    return PEER_MAIN + f"""
http {{
    {policy}
    server {{
        listen 127.0.0.1:{{port}} {listen};
        location / {{ proxy_pass http://127.0.0.1:{upstream_port}; }}
    }}
}}
"""


def seen_h1(port: int) -> tuple[int, set[str]]:
    extra = "".join(f"{n}: {v}\r\n" for n, v in SENT)
    a = exchange(port, f"GET / HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode())
    return a.status, set(a.body.decode().split())


CASES = [
    ("", {"x-ok"}),
    ("underscores_in_headers on;", {"x-ok", "x_under"}),
    ("ignore_invalid_headers off;", {"x-ok", "x_under", "x.dot", "x~tilde"}),
    ("ignore_invalid_headers off; underscores_in_headers on;", {"x-ok", "x_under", "x.dot", "x~tilde"}),
]


@pytest.mark.parametrize("policy,expect", CASES)
def test_http1_headers_seen_upstream_as_nginx(tmp_path, upstream, policy, expect):
    with side_by_side(tmp_path, conf(upstream.port, policy)) as (srv, nginx_port):
        g_status, g_seen = seen_h1(srv.port)
        n_status, n_seen = seen_h1(nginx_port)
        assert (g_status, g_seen & {n.lower() for n, _ in SENT}) == (200, expect)
        assert (g_status, g_seen) == (n_status, n_seen)
        dropped = [f"{n}: {v}" for n, v in SENT if n.lower() not in expect]
        for line in dropped:
            msg = f'client sent invalid header line: "{line}"'
            wait_until(lambda: msg in srv.error_log())
            assert msg in (tmp_path / "nginx" / "error.log").read_text()
        if not dropped:
            assert "invalid header" not in srv.error_log()


def test_dropped_host_and_length_are_not_seen(tmp_path, upstream):
    """A dropped field is gone for every purpose: `Ho_st` is no Host (HTTP/1.1 needs one:
    400), `Content_Length` frames no body."""
    with side_by_side(tmp_path, conf(upstream.port, "")) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            assert exchange(port, b"GET / HTTP/1.1\r\nHo_st: t\r\nConnection: close\r\n\r\n").status == 400
            a = exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\nContent_Length: 3\r\nConnection: close\r\n\r\n")
            assert a.status == 200 and "content-length" not in a.body.decode().split()


def test_policy_comes_from_the_default_server(tmp_path, upstream):
    """The names are checked before Host picks a server: the address's default server's
    setting applies, whichever server the request goes to."""
    c = PEER_MAIN + f"""
http {{
    server {{
        listen 127.0.0.1:{{port}} default_server;
        server_name default.test;
        location / {{ proxy_pass http://127.0.0.1:{upstream.port}; }}
    }}
    server {{
        listen 127.0.0.1:{{port}};
        server_name other.test;
        underscores_in_headers on;
        location / {{ proxy_pass http://127.0.0.1:{upstream.port}; }}
    }}
}}
"""
    req = b"GET / HTTP/1.1\r\nX_Under: u\r\nHost: other.test\r\nConnection: close\r\n\r\n"
    with side_by_side(tmp_path, c) as (srv, nginx_port):
        g, n = exchange(srv.port, req), exchange(nginx_port, req)
        assert (g.status, g.body) == (n.status, n.body)
        assert "x_under" not in g.body.decode().split()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("policy,expect", CASES)
def test_http2_headers_seen_upstream_as_nginx(tmp_path, upstream, policy, expect):
    # nginx 1.22 says `listen ... http2`; gannet takes the same form.
    with side_by_side(tmp_path, conf(upstream.port, policy, listen="http2")) as (srv, nginx_port):
        seen = {}
        for who, port in (("gannet", srv.port), ("nginx", nginx_port)):
            args = [a for n, v in SENT for a in ("-H", f"{n}: {v}")]
            r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", *args, "-w", "%{http_code}",
                                f"http://127.0.0.1:{port}/"], capture_output=True, timeout=10)
            out = r.stdout.decode()
            seen[who] = (out[-3:], set(out[:-3].split()))
        assert seen["gannet"] == seen["nginx"]
        assert seen["gannet"][0] == "200"
        assert seen["gannet"][1] & {n.lower() for n, _ in SENT} == expect
        for n, _ in SENT:
            if n.lower() not in expect:
                msg = f'client sent invalid header: "{n.lower()}"'
                wait_until(lambda: msg in srv.error_log())
                assert msg in (tmp_path / "nginx" / "error.log").read_text()
