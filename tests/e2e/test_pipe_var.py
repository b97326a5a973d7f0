"""`$pipe` on gannet and Debian's nginx with one config: `p` for a request that was already
in the buffer when the one before it ended, `.` otherwise.
"""

from __future__ import annotations

import socket

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format pipe "$uri $pipe";
    server {
        listen 127.0.0.1:{port};
        access_log {tmp}/pipe.log pipe;
        location / { return 200 "ok"; }
    }
}
"""


def pipelined(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_pipe_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        pipelined(srv.port)
        pipelined(nginx_port)
        logs = []
        for side in ("gannet", "nginx"):
            f = tmp_path / side / "pipe.log"
            assert wait_until(lambda: f.exists() and f.read_text().count("\n") == 4)
            logs.append(f.read_text())
    assert logs[0] == logs[1] == "/a .\n/b p\n/c p\n/d .\n"
