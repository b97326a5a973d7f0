"""`post_action` on gannet and Debian's nginx with one config: the client gets its answer
alone, and the request also goes to the post action's URI or named location (seen here by
the request a proxied post action makes to the server itself, in its access log).
"""

from __future__ import annotations

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format u "$uri";
    root {root};
    server {
        listen 127.0.0.1:{port};
        location / { access_log off; post_action /post.remote; }
        location /named { access_log off; post_action @after; }
        location @after { rewrite ^ /tracked-named break; proxy_pass http://127.0.0.1:{port}; }
        location /post.remote { access_log off; proxy_pass http://127.0.0.1:{port}/tracked; }
        location /tracked { access_log {tmp}/t.log u; return 204; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_post_action_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, {"index.html": "SEE-THIS", "named": "NAMED"}) as (srv, nginx_port):
        logs = []
        for port, side in ((srv.port, "gannet"), (nginx_port, "nginx")):
            a = exchange(port, b"GET / HTTP/1.0\r\n\r\n")
            b = exchange(port, b"GET /named HTTP/1.0\r\n\r\n")
            assert (a.status, a.body, b.status, b.body) == (200, b"SEE-THIS", 200, b"NAMED"), side
            f = tmp_path / side / "t.log"
            assert wait_until(lambda: f.exists() and f.read_text().count("\n") == 2), side
            logs.append(sorted(f.read_text().splitlines()))
    assert logs[0] == logs[1] == ["/tracked", "/tracked-named"]
