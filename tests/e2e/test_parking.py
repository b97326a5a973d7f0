"""Idle keep-alive connections leave their task after a second of silence ("parking",
runtime/parking.rs) and come back when the client speaks again. These tests hold a
connection idle past that point on purpose: the idle time is the behaviour under test."""

import signal
import socket
import time

REQ = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"


def read_response(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def idle_for(s: socket.socket, seconds: float) -> bytes:
    """Wait `seconds` for anything from the server; return what came (b"" if it closed)."""
    s.settimeout(seconds)
    try:
        return s.recv(4096)
    except socket.timeout:
        return b"(silent)"


def test_parked_connection_is_served_again(gannet):
    srv = gannet.start(files={"a.txt": "parked"}, http="keepalive_timeout 30s;")
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(REQ)
        assert b"200 OK" in read_response(s)
        assert idle_for(s, 1.8) == b"(silent)", "the server closed a connection it should have kept"
        s.settimeout(5)
        for _ in range(3):
            s.sendall(REQ)
            out = read_response(s)
            assert out.startswith(b"HTTP/1.1 200 OK") and b"keep-alive" in out


def test_parked_connection_closes_at_keepalive_timeout(gannet):
    srv = gannet.start(files={"a.txt": "x"}, http="keepalive_timeout 3s;")
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(REQ)
        read_response(s)
        start = time.monotonic()
        assert idle_for(s, 8) == b"", "a parked connection outlived its keepalive_timeout"
        assert 2.5 <= time.monotonic() - start < 6


def test_parked_again_keeps_its_new_deadline(gannet):
    """A connection that parks, is woken by a request and parks again (in the slot it
    left) is closed at its second keep-alive deadline, not its first: the lot's deadline
    queue still holds the first one when it comes due. A second connection, parked once,
    is closed at its own."""
    srv = gannet.start(files={"a.txt": "x"}, http="keepalive_timeout 4s;")
    with socket.create_connection(("127.0.0.1", srv.port)) as s, \
            socket.create_connection(("127.0.0.1", srv.port)) as other:
        for c in (s, other):
            c.sendall(REQ)
            read_response(c)
        assert idle_for(s, 1.6) == b"(silent)"  # parked after 1 s, first deadline at 4 s
        s.settimeout(5)
        s.sendall(REQ)
        assert read_response(s).startswith(b"HTTP/1.1 200 OK")
        again = time.monotonic()  # parks again 1 s later; due 4 s after this
        assert idle_for(other, 5) == b"", "the connection parked once outlived its keepalive_timeout"
        assert idle_for(s, 0.8) == b"(silent)", "closed at the deadline of its first park"
        assert idle_for(s, 5) == b""
        assert 3.5 <= time.monotonic() - again < 5.5


def test_graceful_stop_closes_parked_connections(gannet):
    srv = gannet.start(files={"a.txt": "x"}, http="keepalive_timeout 60s;")
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(REQ)
        read_response(s)
        assert idle_for(s, 1.8) == b"(silent)"
        srv.proc.send_signal(signal.SIGQUIT)
        assert idle_for(s, 5) == b""
    assert srv.proc.wait(10) == 0


def test_many_parked_connections_then_fresh_request(gannet):
    srv = gannet.start(files={"a.txt": "x"}, http="keepalive_timeout 30s;")
    socks = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(REQ)
            socks.append(s)
        for s in socks:
            assert b"200 OK" in read_response(s)
        assert idle_for(socks[0], 1.8) == b"(silent)"
        for s in socks[::37]:
            s.settimeout(5)
            s.sendall(REQ)
            assert read_response(s).startswith(b"HTTP/1.1 200 OK")
        status, _, body = srv.get("/a.txt")
        assert (status, body) == (200, b"x")
    finally:
        for s in socks:
            s.close()
