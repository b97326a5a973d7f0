"""`proxy_request_buffering off` as nginx's ngx_http_read_client_request_body: a body that
has all come with the request (or to the first read into the body buffer) is kept whole,
so `$request_body` has it; what has come goes to the upstream in the same write as the
request's head; and an error page reached after the upstream still reads `$request_body`.
Each checked against Debian's nginx with the same config."""

import socket

import pytest

import rawapps
from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")


def answer(conn, head, _body):
    path = head.split(b" ")[1]
    status = "404 Not Found" if path.startswith(b"/404") else "200 OK"
    conn.sendall(rawapps.http_answer(b"app\n", status=status, keep=False))


def conf(app_port: int, preread_port: int) -> str:
    return PEER_MAIN + """
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        client_header_buffer_size 1k;
        proxy_request_buffering off;
        location / {
            client_body_buffer_size 2k;
            add_header X-Body "$request_body";
            proxy_pass http://127.0.0.1:%d;
        }
        location /ep {
            proxy_pass http://127.0.0.1:%d/404;
            proxy_intercept_errors on;
            error_page 404 /rb;
        }
        location /rb { return 200 "rb=$request_body\\n"; }
        location /preread { proxy_pass http://127.0.0.1:%d; }
        location /chunked { proxy_http_version 1.1; proxy_pass http://127.0.0.1:%d; }
    }
}
""" % (app_port, app_port, preread_port, preread_port)


def pipelined(port: int, bodies: list[bytes], path: str = "/") -> bytes:
    """The requests with their bodies, all sent in one write (the bodies have all come when
    the server looks), and the answers."""
    reqs = b""
    for i, b in enumerate(bodies):
        close = b"Connection: close\r\n" if i == len(bodies) - 1 else b""
        reqs += b"GET %s HTTP/1.1\r\nHost: x\r\n" % path.encode() + close + b"Content-Length: %d\r\n\r\n" % len(b) + b
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(reqs)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def x_bodies(raw: bytes) -> list[bytes]:
    return [line[len(b"X-Body: "):].rstrip(b"\r") for line in raw.split(b"\n") if line.startswith(b"X-Body: ")]


def test_body_come_whole_is_kept(tmp_path):
    app = rawapps.HttpApp(answer)
    with side_by_side(tmp_path, conf(app.port, free_port())) as (srv, nginx_port):
        for body in (b"0123456789", b"0123456789" * 128):
            ours, theirs = x_bodies(pipelined(srv.port, [body])), x_bodies(pipelined(nginx_port, [body]))
            assert ours == theirs == [body]
        # The third body is longer than the body buffer holds: passed on as it comes, the
        # last (all come with its head) kept whole again.
        bodies = [b"0123456789", b"0123456789" * 128, b"0123456789" * 512, b"foobar"]
        ours, theirs = x_bodies(pipelined(srv.port, bodies)), x_bodies(pipelined(nginx_port, bodies))
        assert ours == theirs
        assert ours[-1] == b"foobar"


def test_error_page_reads_request_body(tmp_path):
    app = rawapps.HttpApp(answer)
    with side_by_side(tmp_path, conf(app.port, free_port())) as (srv, nginx_port):
        ours, theirs = pipelined(srv.port, [b"0123456789"], "/ep"), pipelined(nginx_port, [b"0123456789"], "/ep")
        assert ours.split(b"\r\n")[0] == theirs.split(b"\r\n")[0] == b"HTTP/1.1 404 Not Found"
        assert ours.split(b"\r\n\r\n", 1)[1] == theirs.split(b"\r\n\r\n", 1)[1] == b"rb=0123456789\n"


def preread_exchange(port: int, listener: socket.socket, chunked: bool = False) -> tuple[bytes, bytes, bytes]:
    """A body part of which comes with the head: what the upstream's first read gets after
    the head, what it gets once the rest is sent, and the answer's status line. Chunked,
    each part is two chunks, which nginx passes on as one (all it read at once)."""
    if chunked:
        head = b"GET /chunked HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
        part1, part2 = b"5\r\n01234\r\n4\r\nmany\r\n", b"5\r\n56789\r\n4\r\nmany\r\n0\r\n\r\n"
    else:
        head = b"GET /preread HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10\r\n\r\n"
        part1, part2 = b"01234", b"56789"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(head + part1)
        up, _ = listener.accept()
        with up:
            up.settimeout(10)
            first = b""
            while b"\r\n\r\n" not in first:
                first += up.recv(1024)
            preread = first.split(b"\r\n\r\n", 1)[1]
            c.sendall(part2)
            rest = b""
            while not (rest.endswith(b"0\r\n\r\n") if chunked else len(preread) + len(rest) >= 10):
                rest += up.recv(1024)
            up.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nOK\n")
        answer_ = b""
        while chunk := c.recv(65536):
            answer_ += chunk
    return preread, rest, answer_.split(b"\r\n", 1)[0]


def test_preread_goes_with_the_head(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        app = rawapps.HttpApp(answer)
        with side_by_side(tmp_path, conf(app.port, listener.getsockname()[1])) as (srv, nginx_port):
            ours, theirs = preread_exchange(srv.port, listener), preread_exchange(nginx_port, listener)
            assert ours == theirs == (b"01234", b"56789", b"HTTP/1.1 200 OK")
            ours = preread_exchange(srv.port, listener, chunked=True)
            theirs = preread_exchange(nginx_port, listener, chunked=True)
            assert ours == theirs == (b"9\r\n01234many\r\n", b"9\r\n56789many\r\n0\r\n\r\n", b"HTTP/1.1 200 OK")
