"""A client that closes while a `limit_rate`d answer waits for its next write: its
connection ends then (nginx's ngx_http_test_reading), not when the write would come, as
`stub_status` shows; compared with Debian's nginx."""

import re
import socket

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")

CONF = PEER_MAIN + """
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /rate { limit_rate 15; }
        location /stub { stub_status; }
    }
}
"""


def active(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /stub HTTP/1.0\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    m = re.search(rb"Active connections: (\d+)", out)
    assert m, out
    return int(m.group(1))


@pytest.mark.parametrize("server", ["gannet", "nginx"])
def test_closed_client_of_a_paced_answer_is_gone(tmp_path, server):
    with side_by_side(tmp_path, CONF, files={"rate": b"x" * 300}) as (srv, nginx_port):
        port = srv.port if server == "gannet" else nginx_port
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.sendall(b"GET /rate HTTP/1.1\r\nHost: x\r\n\r\n")
        # The first second's worth has come; each next write waits for its second.
        assert c.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert active(port) == 2
        c.close()
        # At once: the next paced write (and its failure) is up to a second or two away.
        assert wait_until(lambda: active(port) == 1, deadline=0.5)
