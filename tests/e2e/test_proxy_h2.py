"""`proxy_http_version 2`: the reverse proxy speaking HTTP/2 to a real HTTP/2 server,
Debian's nginx with `http2` on its listener (h2c with prior knowledge, and TLS with ALPN
h2). Checked: bodies byte-exact both ways (large, streamed), many concurrent requests
multiplexed over one kept upstream connection and sequential ones reusing it (counted in
the upstream's own access log, `$connection`), trailers to HTTP/2 and chunked HTTP/1.1
clients (`proxy_pass_trailers`), an unreachable server -> 502 and the next one tried, a
silent one -> 504, and the directive's values."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import free_port, wait_until
from nginx_peer import NGINX, NginxPeer

pytestmark = pytest.mark.skipif(NGINX is None, reason="needs Debian's nginx as the HTTP/2 upstream")

NGHTTP = shutil.which("nghttp")

UP_MAIN = r"""
user root;
worker_processes 1;
pid {tmp}/server.pid;
error_log {tmp}/error.log info;
events { worker_connections 256; }
"""

# The upstream: nginx over HTTP/2, logging each request's connection number and the
# protocol it came over.
UP_CONF = UP_MAIN + r"""
http {
    log_format c '$connection $connection_requests $server_protocol $request_uri "$http_x_set" "$http_connection"';
    access_log {tmp}/access.log c;
    client_body_temp_path {tmp}/body;
    server {
        listen 127.0.0.1:{port} %s;
        %s
        root {root};
        add_trailer X-Trailer foo;
        add_trailer X-Hidden bar;
        location /put/ {
            dav_methods PUT;
            create_full_put_path on;
            client_max_body_size 0;
        }
    }
}
"""


def upstream(tmp: Path, files: dict[str, bytes], tls: tuple[Path, Path] | None = None, listen: str = "http2", more: str = "") -> NginxPeer:
    root = tmp / "up-www"
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "put").mkdir(parents=True, exist_ok=True)
    if tls:
        listen, extra = "ssl http2", f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};"
    else:
        extra = ""
    return NginxPeer(UP_CONF % (listen, extra + more), free_port(), root, tmp / "up")


def up_log(peer: NginxPeer) -> list[list[str]]:
    p = peer.tmp / "access.log"
    return [line.split(" ") for line in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture
def big():
    return os.urandom(3 * 1024 * 1024 + 123)


def test_bodies_byte_exact_both_ways(gannet, tmp_path, big):
    up = upstream(tmp_path, {"big.bin": big, "small.txt": b"SEE-THIS"})
    try:
        srv = gannet.start(http=f"upstream u {{ server 127.0.0.1:{up.port}; keepalive 2; }}", server=f"""
            proxy_http_version 2;
            client_max_body_size 0;
            location / {{ proxy_pass http://u; }}
            location /unbuf/ {{ proxy_pass http://u/; proxy_buffering off; }}
            location /put/ {{ proxy_pass http://u; proxy_request_buffering off; }}
            location /putb/ {{ proxy_pass http://u/put/; }}
        """)
        st, h, body = srv.get("/small.txt")
        assert (st, body) == (200, b"SEE-THIS")
        assert h["content-length"] == "8"
        # Large answers, buffered (spooled) and unbuffered (read as the client takes it).
        for path in ("/big.bin", "/unbuf/big.bin"):
            st, _, body = srv.get(path)
            assert st == 200 and body == big, path
        # Request bodies: streamed as they arrive (chunked from the client, no length),
        # and read whole first (with a length).
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-T", "-",
                              "-H", "Transfer-Encoding: chunked", f"{srv.base}/put/streamed.bin"],
                             input=big, capture_output=True, timeout=30)
        assert out.stdout == b"201"
        assert (up.tmp.parent / "up-www/put/streamed.bin").read_bytes() == big
        st, _, _ = srv.request("PUT", "/putb/whole.bin", body=big)
        assert st == 201
        assert (up.tmp.parent / "up-www/put/whole.bin").read_bytes() == big
        # All of it went over HTTP/2.
        assert {r[2] for r in up_log(up)} == {"HTTP/2.0"}
    finally:
        up.stop()


def test_multiplexed_and_kept_connections(gannet, tmp_path, big):
    up = upstream(tmp_path, {"big.bin": big, "small.txt": b"SEE-THIS"})
    try:
        srv = gannet.start(http=f"""
            upstream kept {{ server 127.0.0.1:{up.port}; keepalive 4; }}
            upstream fresh {{ server 127.0.0.1:{up.port}; }}
        """, server="""
            proxy_http_version 2;
            location /k/ { proxy_pass http://kept/; proxy_set_header X-Set kept; }
            location /f/ { proxy_pass http://fresh/; proxy_set_header X-Set fresh; }
        """)
        n = 24
        with ThreadPoolExecutor(n) as pool:
            got = list(pool.map(lambda _: srv.get("/k/big.bin"), range(n)))
        assert all(st == 200 and body == big for st, _, body in got)
        for _ in range(3):
            assert srv.get("/k/small.txt")[2] == b"SEE-THIS"
        kept = [r for r in up_log(up) if r[4] == '"kept"']
        assert len(kept) == n + 3
        conns = {r[0] for r in kept}
        # nginx allows 128 streams a connection: all of them shared one (or two, should
        # one fill up while the stream queued on it waits).
        assert len(conns) <= 2, conns
        assert max(int(r[1]) for r in kept) >= n // 2
        # proxy_set_header went, and no Connection field (HTTP/2 has none).
        assert all(r[5] == '"-"' for r in kept)
        # Without `keepalive`, a connection per request, closed after it.
        for _ in range(3):
            assert srv.get("/f/small.txt")[0] == 200
        fresh = [r for r in up_log(up) if r[4] == '"fresh"']
        assert len({r[0] for r in fresh}) == 3 and all(r[1] == "1" for r in fresh)
    finally:
        up.stop()


def test_server_closing_kept_connection(gannet, tmp_path):
    # nginx ends a connection after 5 requests (GOAWAY): the streams it refused, and the
    # requests that find the connection closing, go on a new one - no request fails.
    up = upstream(tmp_path, {"small.txt": b"SEE-THIS"}, more="keepalive_requests 5;")
    try:
        srv = gannet.start(http=f"upstream u {{ server 127.0.0.1:{up.port}; keepalive 2; }}", server="""
            proxy_http_version 2;
            location / { proxy_pass http://u; }
        """)
        for _ in range(4):
            assert srv.get("/small.txt")[0] == 200
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda _: srv.get("/small.txt"), range(32)))
        assert [st for st, _, _ in got] == [200] * 32
        log = up_log(up)
        assert len(log) == 36 and max(int(r[1]) for r in log) <= 5
        assert "[error]" not in srv.error_log()
    finally:
        up.stop()


def test_trailers(gannet, tmp_path):
    up = upstream(tmp_path, {"t.txt": b"SEE-THIS"})
    try:
        h2port = free_port()
        srv = gannet.start(http=f"upstream u {{ server 127.0.0.1:{up.port}; keepalive 2; }}", server=f"""
            listen 127.0.0.1:{h2port} http2;
            proxy_http_version 2;
            proxy_pass_trailers on;
            proxy_hide_header X-Hidden;
            location / {{ proxy_pass http://u; }}
            location /chunked/ {{ proxy_pass http://u/; add_trailer X-Own "";}}
            location /off/ {{ proxy_pass http://u/; proxy_pass_trailers off; add_trailer X-Own ""; }}
        """)
        # HTTP/1.1: trailers follow the last chunk when the answer is chunked anyway.
        req = b"GET /chunked/t.txt HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: close\r\n\r\n"
        raw = srv.raw(req)
        assert raw.endswith(b"\r\n8\r\nSEE-THIS\r\n0\r\nx-trailer: foo\r\n\r\n"), raw
        raw = srv.raw(req.replace(b"/chunked/", b"/off/"))
        assert raw.endswith(b"\r\n8\r\nSEE-THIS\r\n0\r\n\r\n"), raw
        # An answer with a length is not made chunked for them (nginx sets no
        # `expect_trailers` for an upstream's).
        raw = srv.raw(req.replace(b"/chunked/", b"/"))
        assert b"Content-Length: 8\r\n" in raw and raw.endswith(b"\r\n\r\nSEE-THIS"), raw
        if NGHTTP:
            out = subprocess.run([NGHTTP, "-v", f"http://127.0.0.1:{h2port}/t.txt"],
                                 capture_output=True, text=True, timeout=10).stdout
            assert "SEE-THIS" in out
            assert "x-trailer: foo" in out
            # proxy_hide_header hides a trailer too, as nginx.
            assert "x-hidden" not in out
    finally:
        up.stop()


def test_trailers_from_http11_upstream(gannet, tmp_path):
    # nginx 1.29's proxy_pass_trailers takes an HTTP/1.1 server's (after its last chunk)
    # the same way.
    up = upstream(tmp_path, {"t.txt": b"SEE-THIS"}, listen="")
    try:
        srv = gannet.start(server=f"""
            proxy_http_version 1.1;
            add_trailer X-Own "";
            location / {{ proxy_pass http://127.0.0.1:{up.port}; proxy_pass_trailers on; }}
            location /off/ {{ proxy_pass http://127.0.0.1:{up.port}/; }}
        """)
        req = b"GET /t.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        raw = srv.raw(req)
        assert raw.endswith(b"\r\n8\r\nSEE-THIS\r\n0\r\nx-trailer: foo\r\nx-hidden: bar\r\n\r\n"), raw
        raw = srv.raw(req.replace(b"/t.txt", b"/off/t.txt"))
        assert raw.endswith(b"\r\n8\r\nSEE-THIS\r\n0\r\n\r\n"), raw
    finally:
        up.stop()


def test_upstream_down_502_and_next(gannet, tmp_path):
    up = upstream(tmp_path, {"t.txt": b"SEE-THIS"})
    dead = free_port()
    try:
        srv = gannet.start(http=f"""
            upstream two {{ server 127.0.0.1:{dead}; server 127.0.0.1:{up.port}; keepalive 2; }}
        """, server=f"""
            proxy_http_version 2;
            location /down/ {{ proxy_pass http://127.0.0.1:{dead}/; }}
            location /two/ {{ proxy_pass http://two/; }}
        """)
        assert srv.get("/down/t.txt")[0] == 502
        assert wait_until(lambda: "connect() failed (111: Connection refused)" in srv.error_log())
        for _ in range(2):
            st, _, body = srv.get("/two/t.txt")
            assert (st, body) == (200, b"SEE-THIS")
    finally:
        up.stop()


def test_timeouts_504(gannet):
    # A server that takes the connection and never answers: the request times out.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(lsock.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        port = lsock.getsockname()[1]
        srv = gannet.start(server=f"""
            proxy_http_version 2;
            location / {{ proxy_pass http://127.0.0.1:{port}; proxy_read_timeout 1s; }}
        """)
        assert srv.get("/x")[0] == 504
        assert wait_until(lambda: "upstream timed out" in srv.error_log())
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        lsock.close()


def test_tls_upstream_alpn_h2(gannet, tmp_path):
    from test_tls import Pki

    (tmp_path / "pki").mkdir()
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("up", "localhost", sans=("localhost",))
    up = upstream(tmp_path, {"t.txt": b"SEE-THIS"}, tls=(cert, key))
    try:
        srv = gannet.start(server=f"""
            proxy_http_version 2;
            location / {{
                proxy_pass https://127.0.0.1:{up.port};
                proxy_ssl_verify on;
                proxy_ssl_name localhost;
                proxy_ssl_trusted_certificate {pki.d / "ca.pem"};
            }}
        """)
        st, _, body = srv.get("/t.txt")
        assert (st, body) == (200, b"SEE-THIS")
        assert [r[2] for r in up_log(up)] == ["HTTP/2.0"]
    finally:
        up.stop()


def test_directive_values(gannet):
    for v in ("1.0", "1.1", "2"):
        r = gannet.check(server=f"proxy_http_version {v};")
        assert r.returncode == 0, r.stderr
    r = gannet.check(server="proxy_http_version 3;")
    assert r.returncode != 0
    assert 'invalid value "3"' in r.stderr and "check.conf:" in r.stderr
