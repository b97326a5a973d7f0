"""A stream session from accept to close: what its plain relay costs the worker in system
calls (strace on the worker: its sockets leave the event loop with their close, never with
an `EPOLL_CTL_DEL`; the client's TCP_NODELAY comes from the listening socket, the
upstream's is not set for a one-send session), the client's
first bytes reaching the next server when the first refuses,
and a server without a handler (nginx 1.27.1+: loaded, its sessions end with 500).
"""

from __future__ import annotations

import os
import re
import signal
import socket

import pytest

from conftest import free_port
from test_stream import Echo, conf, dead_port, log_lines, talk
from test_stream_splice import trace_worker

needs_strace = pytest.mark.skipif(not os.path.exists("/usr/bin/strace"), reason="needs strace")


@pytest.fixture
def echo():
    e = Echo(2)
    yield e
    e.close()


def exchange(port: int, data: bytes) -> bytes:
    """Send, read the echo's answer (its tag and the bytes), close."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        while len(got) < len(data) + 3:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got


@needs_strace
def test_short_sessions_leave_epoll_by_their_close(gannet, tmp_path, echo):
    """N short sessions (send, read the answer, close) through the plain relay: no
    EPOLL_CTL_DEL at all (a closed socket leaves an epoll set by itself, as nginx counts
    on), at most two EPOLL_CTL_ADD per session (client and upstream), and no
    TCP_NODELAY call (the client's is inherited from the listening socket; the
    upstream's is set before its second send, and a short session sends it one: see
    test_stream_misc's test_tcp_nodelay_on_the_upstream_before_its_second_send). The
    answers and the log are as ever."""
    p, n = free_port(), 20
    srv = gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{echo.ports[0]}; }}"))
    assert exchange(p, b"warm") == b"[0]warm"
    log_lines(srv.tmp, 1)
    out = tmp_path / "trace"
    tracer = trace_worker(srv.worker_pid(), out, "epoll_ctl,setsockopt")
    try:
        for i in range(n):
            msg = f"hello {i}".encode()
            assert exchange(p, msg) == b"[0]" + msg
        lines = log_lines(srv.tmp, n + 1)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    assert all(l.startswith("127.0.0.1 TCP 200 ") for l in lines), lines
    text = out.read_text()
    assert "EPOLL_CTL_DEL" not in text, text
    adds = len(re.findall(r"EPOLL_CTL_ADD", text))
    assert 0 < adds <= 2 * n, text
    assert "TCP_NODELAY" not in text, text


def test_first_bytes_reach_the_next_server_after_a_refusal(gannet, echo):
    """The first server refuses: the client's first bytes (read as that connect was under
    way, when they were there by then) go to the second one, once, and count once in the
    log."""
    p, dead = free_port(), dead_port()
    srv = gannet.start(conf=conf(
        f"upstream u {{ server 127.0.0.1:{dead}; server 127.0.0.1:{echo.ports[1]}; }}\n"
        f"server {{ listen 127.0.0.1:{p}; proxy_pass u; }}"))
    msg = b"x" * 3000
    assert exchange(p, msg) == b"[1]" + msg
    line = log_lines(srv.tmp, 1)[0]
    assert line == f'127.0.0.1 TCP 200 3003 3000 "127.0.0.1:{dead}, 127.0.0.1:{echo.ports[1]}" 0, 3000 0, 3003', line


def test_server_without_handler(gannet):
    """nginx 1.27.1+ loads a server with neither `proxy_pass` nor `return` (1.22 refused it,
    so there is no side by side here): a TCP session is accepted and closed with nothing
    sent, a UDP datagram gets no reply, both logged with 500 (the datagram counted as
    received); `deny` still comes first (403)."""
    p, q, u = free_port(), free_port(), free_port()
    srv = gannet.start(conf=conf(
        f"server {{ listen 127.0.0.1:{p}; listen 127.0.0.1:{u} udp; }}\n"
        f"server {{ listen 127.0.0.1:{q}; deny all; }}"))
    assert talk(p) == b""
    assert log_lines(srv.tmp, 1)[0] == '127.0.0.1 TCP 500 0 0 "-" - -'
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as d:
        d.sendto(b"ping!", ("127.0.0.1", u))
        assert log_lines(srv.tmp, 2)[1] == '127.0.0.1 UDP 500 0 5 "-" - -'
        # The line is written as the session ends: a reply would be here by now.
        d.setblocking(False)
        with pytest.raises(BlockingIOError):
            d.recv(100)
    assert talk(q) == b""
    assert log_lines(srv.tmp, 3)[2] == '127.0.0.1 TCP 403 0 0 "-" - -'
    r = gannet.check(conf=conf(f"server {{ listen 127.0.0.1:{free_port()}; }}"))
    assert r.returncode == 0, r.stderr


