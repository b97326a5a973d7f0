"""A `mirror` copy is logged by `log_subrequest on` in the location it ends in, on gannet
and Debian's nginx with one config (without it, not at all).
"""

from __future__ import annotations

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format test "$uri $status";
    root {root};
    access_log {tmp}/all.log test;
    server {
        listen 127.0.0.1:{port};
        location / { mirror /mirror; }
        location /quiet/ { mirror /silent; }
        location /mirror { log_subrequest on; access_log {tmp}/m.log test; return 204; }
        location /silent { access_log {tmp}/m.log test; return 204; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_mirror_logged_with_log_subrequest(tmp_path):
    with side_by_side(tmp_path, CONF, {"index.html": "x", "quiet/index.html": "q"}) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            exchange(port, b"GET /quiet/index.html HTTP/1.0\r\n\r\n")
            exchange(port, b"GET /index.html HTTP/1.0\r\n\r\n")
        for side in ("gannet", "nginx"):
            f = tmp_path / side / "m.log"
            assert wait_until(lambda: f.exists() and f.read_text() == "/mirror 204\n"), (side, f.exists() and f.read_text())
            a = tmp_path / side / "all.log"
            assert wait_until(lambda: a.exists() and a.read_text().count("\n") == 2), side
