"""Slow and broken clients: `client_header_timeout` bounding a whole request head (slowloris),
`client_body_timeout` between two body reads, a worker at `worker_connections` reusing its
idle connections, malformed chunked bodies refused whatever the location does with them
(against Debian's nginx), and an invalid HTTP/2 preface on a port shared by HTTP/1.1 and
h2c. Everything over real sockets on loopback; times are measured, never slept on.
"""

from __future__ import annotations

import select
import socket
import struct
import time

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

# The worker's deadlines are swept every 250 ms (runtime::read_timers), and the machine
# is shared: a timeout may fire this much late.
LATE = 1.0


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def trickle_until_closed(s: socket.socket, lines, every: float, limit: float) -> float:
    """Send one of `lines` every `every` seconds until the server closes the connection (or
    `limit` passes): the time it took, from the call. Fails if anything is answered."""
    start = time.monotonic()
    lines = iter(lines)
    while time.monotonic() - start < limit:
        ready, _, _ = select.select([s], [], [], every)
        if ready:
            try:
                data = s.recv(4096)
            except ConnectionResetError:
                data = b""
            assert data == b"", f"answered {data!r}"
            return time.monotonic() - start
        try:
            s.sendall(next(lines))
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
    return time.monotonic() - start


def header_lines():
    n = 0
    while True:
        yield b"X-Slow-%d: still coming\r\n" % n
        n += 1


def test_client_header_timeout_bounds_the_whole_head(gannet):
    # One header line every 0.4 s: each read comes well within the 2 s, but the head as a
    # whole does not, and nginx closes at 2 s from the first byte (unanswered, 408 logged).
    srv = gannet.start(server="client_header_timeout 2s; location / { return 200 ok; }")
    with connect(srv.port) as s:
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: a\r\n")
        took = trickle_until_closed(s, header_lines(), 0.4, 10)
    assert 2 - 0.1 <= took < 2 + LATE, took
    assert wait_until(lambda: '"GET /slow HTTP/1.1" 408 0' in srv.access_log())
    assert "client timed out while reading client request headers" in srv.error_log()


def test_client_header_timeout_on_a_kept_connection_runs_from_the_first_byte(gannet):
    srv = gannet.start(server="client_header_timeout 2s; keepalive_timeout 30s; location / { return 200 ok; }")
    with connect(srv.port) as s:
        s.sendall(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        # Idle longer than client_header_timeout: that is keepalive_timeout's business.
        assert select.select([s], [], [], 2.5)[0] == []
        # Then a request line that stops half-way: closed 2 s after its first byte.
        s.sendall(b"GET /b HT")
        took = trickle_until_closed(s, iter(lambda: b"", None), 0.2, 10)
    assert 2 - 0.1 <= took < 2 + LATE, took
    assert wait_until(lambda: '"GET /b HT" 408 0' in srv.access_log())


def test_client_header_timeout_runs_from_the_accept_for_a_first_request(gannet):
    srv = gannet.start(server="client_header_timeout 2s;")
    with connect(srv.port) as s:
        assert select.select([s], [], [], 1.0)[0] == []
        s.sendall(b"GET / HTTP/1.1\r\n")
        took = trickle_until_closed(s, header_lines(), 0.3, 10)
    # About 1 s after the first byte: 2 s after the accept.
    assert took < 1 + LATE, took


def test_client_body_timeout_counts_between_two_reads(gannet):
    srv = gannet.start(server="client_body_timeout 2s; location / { return 200 ok; }")
    with connect(srv.port) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 8\r\n\r\n")
        # A body nobody wants is not waited for (as nginx): the answer comes first, and
        # the body is read off after it.
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        # Four pieces, 1.2 s apart: 3.6 s in all, longer than the timeout, but no gap is.
        for piece in (b"ab", b"cd", b"ef"):
            s.sendall(piece)
            assert select.select([s], [], [], 1.2)[0] == [], "closed while the body still came"
        # The connection is kept, framed for the next request.
        s.sendall(b"gh" + b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    # A body that stops: the connection closes 2 s after its last byte. (The answer to a
    # location that does not want the body comes at once, as nginx's: the body is read
    # off after it.)
    with connect(srv.port) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 8\r\n\r\nab")
        start = time.monotonic()
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        took = time.monotonic() - start
    assert 2 - 0.1 <= took < 2 + LATE, took
    assert got.startswith(b"HTTP/1.1 200")


SMALL = """
worker_processes 1;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log info;
events { worker_connections 32; }
http {
    access_log {tmp}/access.log;
    client_header_timeout 2s;
    keepalive_timeout 60s;
    server {
        listen 127.0.0.1:{port};
        location / { return 200 "served\\n"; }
    }
}
"""


def closed(s: socket.socket) -> bool:
    """Whether the server has closed `s` (without waiting)."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True


def get(port: int) -> bytes | None:
    """One GET on a new connection: the answer, or None if the connection was refused."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            out = b""
            while chunk := s.recv(4096):
                out += chunk
            return out or None
    except (ConnectionResetError, BrokenPipeError):
        return None


def test_full_worker_closes_its_longest_idle_connections_for_new_ones(gannet):
    srv = gannet.start(conf=SMALL)
    kept = []
    for _ in range(16):
        s = connect(srv.port)
        s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        kept.append(s)
    # Held idle past a second, the kept connections leave their tasks (runtime/parking.rs):
    # both kinds of waiting connection are in play.
    assert select.select(kept, [], [], 1.8)[0] == []
    silent = [connect(srv.port) for _ in range(24)]
    try:
        # 40 connections on a worker of 32, and a real client is still served.
        assert get(srv.port).startswith(b"HTTP/1.1 200")
        # Room was made by closing the connections idle the longest: the first kept ones.
        n = wait_until(lambda: sum(closed(s) for s in kept), 5)
        assert n >= 40 + 1 - 32, n
        gone = [closed(s) for s in kept]
        assert gone == [True] * n + [False] * (16 - n)
        assert not any(closed(s) for s in silent)
        assert "32 worker_connections are not enough, reusing connections" in srv.error_log()
    finally:
        for s in kept + silent:
            s.close()


def test_slow_heads_lock_a_full_worker_for_client_header_timeout_at_most(gannet):
    srv = gannet.start(conf=SMALL)
    slow = []
    start = time.monotonic()
    for _ in range(40):
        s = connect(srv.port)
        try:
            s.sendall(b"GET /slow HTTP/1.1\r\nHost: a\r\n")
        except (ConnectionResetError, BrokenPipeError):
            pass
        slow.append(s)
    try:
        # A connection half-way through its head is not closed for room (as in nginx):
        # new clients wait until client_header_timeout ends the slow ones.
        served = wait_until(lambda: get(srv.port), 2 + LATE + 2, every=0.1)
        took = time.monotonic() - start
        assert served and served.startswith(b"HTTP/1.1 200"), served
        assert took < 2 + LATE + 1, took
        assert wait_until(lambda: all(closed(s) for s in slow), 2)
    finally:
        for s in slow:
            s.close()


MALFORMED_CHUNKED = {
    "bad size": b"Z\r\nZ\r\n",
    "size overflow": b"ffffffffffffffffffff\r\nx\r\n0\r\n\r\n",
    "data longer than its size": b"3\r\nabcdef\r\n0\r\n\r\n",
    "no CRLF after the data": b"3\r\nabc0\r\n\r\n",
    "CR in a chunk extension": b"3;a=\rb\r\nabc\r\n0\r\n\r\n",
}

CHUNKED_CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location = /ret { return 200 "ret\n"; }
        location = /empty { return 204; }
        location = /moved { return 302 /ret; }
    }
}
"""


def statuses_and_close(port: int, request: bytes) -> tuple[list[str], bool]:
    """Send `request`, read until the server closes (or 3 s pass): the status lines that
    came back, and whether it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(request)
        out, closed_by_server = b"", False
        try:
            while chunk := s.recv(65536):
                out += chunk
            closed_by_server = True
        except ConnectionResetError:
            closed_by_server = True
        except socket.timeout:
            pass
    lines = [line.decode() for line in out.split(b"\r\n") if line.startswith(b"HTTP/1.")]
    return lines, closed_by_server


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (scripts/test-all.sh installs it)")
def test_malformed_chunked_body_answers_as_nginx(tmp_path):
    # A GET pipelined behind each request shows whether the connection was kept.
    after = b"GET /ret HTTP/1.1\r\nHost: a\r\n\r\n"
    cases = []
    for path in ("/ret", "/empty", "/moved", "/file.txt", "/missing"):
        for name, body in MALFORMED_CHUNKED.items():
            method = b"GET" if path == "/file.txt" else b"POST"
            head = b"%s %s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" % (method, path.encode())
            cases.append((f"{method.decode()} {path} {name}", head + body + after))
    diffs = []
    with side_by_side(tmp_path, CHUNKED_CONF, files={"file.txt": "file\n"}) as (srv, nginx_port):
        for name, request in cases:
            ours = statuses_and_close(srv.port, request)
            theirs = statuses_and_close(nginx_port, request)
            if ours != theirs:
                diffs.append(f"{name}: gannet {ours}, nginx {theirs}")
        assert "client sent invalid chunked body" in srv.error_log()
    assert not diffs, "\n".join(diffs)
    # What nginx does, so the comparison cannot pass with both servers wrong the same way:
    # a refused body is a 400 where the answer was not an error, and the connection closes.
    assert theirs == (["HTTP/1.1 404 Not Found"], True)


def test_malformed_chunked_body_is_a_400_for_a_return_200(gannet):
    srv = gannet.start(server='location / { return 200 "fine\\n"; }')
    for name, body in MALFORMED_CHUNKED.items():
        request = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + body
        assert statuses_and_close(srv.port, request) == (["HTTP/1.1 400 Bad Request"], True), name


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """HTTP/2 frames as (type, payload)."""
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], data[9 : 9 + length]))
        data = data[9 + length :]
    return out


def read_all(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(4096):
                out += chunk
        except ConnectionResetError:
            pass
        return out


@pytest.mark.parametrize("opening", [
    b"INVALID CONNECTION PREFACE\r\n\r\n",  # h2spec 3.5/2
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
    b"PRI * HTTP/2.0\r\nHost: a\r\n\r\n",
])
def test_invalid_h2_preface_on_a_port_shared_with_http11_is_refused_as_http2(gannet, opening):
    # `http2 on` on a cleartext address: HTTP/1.1 and prior-knowledge h2c on one port.
    srv = gannet.start(server='http2 on; location / { return 200 "fine\\n"; }')
    got = frames(read_all(srv.port, opening))
    assert got[-1] == (0x7, struct.pack(">II", 0, 1)), got  # GOAWAY, no stream, PROTOCOL_ERROR
    assert got[0][0] == 0x4, got  # after the server's SETTINGS
    # HTTP/1.1 still answered, a broken request line that is HTTP/1 still a 400.
    assert read_all(srv.port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200")
    assert read_all(srv.port, b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n").startswith(b"HTTP/1.1 400")


def h2spec_bin() -> str | None:
    import os
    import shutil

    home = os.path.expanduser("~/go/bin/h2spec")
    return shutil.which("h2spec") or (home if os.path.exists(home) else None)


@pytest.mark.skipif(h2spec_bin() is None, reason="h2spec is not installed (scripts/test-all.sh installs it)")
def test_h2spec_preface_cases_pass_on_a_shared_port(gannet):
    import subprocess

    srv = gannet.start(server="http2 on;", files={"index.html": "hello\n"})
    r = subprocess.run([h2spec_bin(), "-h", "127.0.0.1", "-p", str(srv.port), "-o", "5", "http2/3.5"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "2 tests, 2 passed, 0 skipped, 0 failed", r.stdout[-2000:]
