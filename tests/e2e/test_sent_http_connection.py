"""`$sent_http_connection` in the access log as nginx's ngx_http_variable_sent_connection
gives it there: "upgrade" after a 101, else "close" (even for a request kept alive: nginx has
cleared r->keepalive by the log phase); compared with Debian's nginx."""

import socket

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side
from rawapps import Listener

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")


class Upgrader(Listener):
    """Answers any request 101 with a few bytes after, then closes."""

    def serve(self, conn):
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = conn.recv(65536)
            if not got:
                return
            buf += got
        conn.sendall(b"HTTP/1.1 101 Switching\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\nhi")
        conn.close()


def exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_sent_http_connection_matches_nginx(tmp_path):
    up = Upgrader()
    conf = PEER_MAIN + """
http {
    log_format c "$request_uri $status $sent_http_connection";
    access_log {tmp}/access.log c;
    server {
        listen 127.0.0.1:{port};
        location /ws { proxy_pass http://127.0.0.1:%d; proxy_http_version 1.1;
                       proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; }
        location / { return 200 "x"; }
    }
}
""" % up.port
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        logs = []
        for port, log in ((srv.port, tmp_path / "gannet" / "access.log"), (nginx_port, tmp_path / "nginx" / "access.log")):
            exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            exchange(port, b"GET /c HTTP/1.0\r\nHost: x\r\n\r\n")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /d HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while not got.endswith(b"\r\n\r\nx"):
                    got += s.recv(65536)
                s.sendall(b"GET /e HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                while s.recv(65536):
                    pass
            exchange(port, b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: foo\r\nConnection: upgrade\r\n\r\n")
            assert wait_until(lambda: log.exists() and log.read_text().count("\n") == 6)
            logs.append(log.read_text())
    # nginx logs a kept-alive request "close" too (its r->keepalive is cleared by then).
    assert logs[0] == logs[1] == "/a 200 close\n/b 200 close\n/c 200 close\n/d 200 close\n/e 200 close\n/ws 101 upgrade\n"
