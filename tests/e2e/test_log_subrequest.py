"""`log_subrequest on`: the subrequests an answer makes (an `auth_request` check, an SSI
`include virtual`, `add_after_body`) each get an access-log line of their own, with their
URI, status and the body bytes they put in the answer, as nginx logs them; off (the
default) only the main request is logged. Checked side by side with Debian's nginx."""

from __future__ import annotations

import pytest

from conftest import log_lines
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format sub "$uri $status $body_bytes_sent";
    access_log {tmp}/access.log sub;
    root {root};
    server {
        listen 127.0.0.1:{port};
        location = /auth { internal; log_subrequest on; return 204; }
        location /ssi/ { ssi on; log_subrequest on; }
        location /inc/ { log_subrequest on; }
        location /add/ { add_after_body /inc/after.txt; log_subrequest on; }
        location /checked/ { auth_request /auth; log_subrequest on; }
        location /quiet/ { ssi on; }
    }
}
"""

FILES = {
    "ssi/page.html": 'A <!--# include virtual="/inc/one.txt" --> B\n',
    "quiet/page.html": 'A <!--# include virtual="/inc/one.txt" --> B\n',
    "inc/one.txt": "one",
    "inc/after.txt": "after\n",
    "add/page.html": "main\n",
    "checked/page.txt": "checked\n",
}


def req(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()


def lines(tmp, n: int) -> list[str]:
    return log_lines(tmp / "access.log", n)


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_subrequests_are_logged_as_nginx_logs_them(tmp_path):
    paths = ["/ssi/page.html", "/add/page.html", "/checked/page.txt", "/quiet/page.html"]
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for p in paths:
            assert exchange(nginx_port, req(p)).status == 200
            assert exchange(srv.port, req(p)).status == 200
        want = lines(tmp_path / "nginx", 8)
        got = lines(tmp_path / "gannet", 8)
    assert got == want
    # Four main requests and four subrequests: whether one is logged is its own location's
    # setting (the quiet page's include is, /inc/ says on). A subrequest's bytes are its
    # main request's (0 for it); a chunked answer's count its framing, as nginx's.
    assert got.count("/inc/one.txt 200 0") == 2 and "/inc/after.txt 200 0" in got
    assert "/auth 204 0" in got and "/ssi/page.html 200 28" in got
    assert len(got) == 8
