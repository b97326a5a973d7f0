"""System calls gannet's event loop saves, checked by running gannet under strace and
counting them, with every answer checked too, since the point is that the paths that skip
a call still serve correctly:

- A cleartext connection enters the event loop (epoll) only when it has to wait
  (`conn::transport::Plain`): a short connection whose request is there at accept and whose
  answer fits the socket buffer costs no `epoll_ctl` at all, as in nginx.
- A kept upstream connection is looked at (a MSG_PEEK recv) before it carries a request only
  when the event loop saw it readable since its last answer (`upstream::still_open`).
- Nor does a proxied request on a new connection register the client's socket to watch for
  the client leaving, unless the exchange lasts 250 ms or more (`conn::h1`, `client_gone`)."""

import os
import re
import signal
import socket
import subprocess
import threading

import pytest

from conftest import free_port, gannet_bin, read_head, wait_port, wait_until
from rawapps import HttpApp, http_answer

CONF = """
user root;
worker_processes 1;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {tmp}/access.log;
    keepalive_timeout 30s;
    {http}
    server {{
        listen 127.0.0.1:{port} deferred;
        root {root};
        {server}
    }}
}}
"""


def traced(tmp, files, calls="epoll_ctl,accept4,close", http="", server=""):
    """gannet under strace (the system `calls` named); returns (port, stop) where stop()
    ends it and gives the trace."""
    root = tmp / "www"
    root.mkdir()
    for name, body in files.items():
        (root / name).write_bytes(body)
    port = free_port()
    conf = tmp / "gannet.conf"
    conf.write_text(CONF.format(tmp=tmp, port=port, root=root, http=http, server=server))
    out = tmp / "trace"
    proc = subprocess.Popen(
        ["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(out), str(gannet_bin()), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_port(port, proc)

    def stop():
        # SIGTERM to gannet itself; strace ends with it and has written the whole trace.
        pidfile = tmp / "gannet.pid"
        pid = wait_until(lambda: pidfile.exists() and pidfile.read_text().strip())
        os.kill(int(pid), signal.SIGTERM)
        proc.wait(20)
        return out.read_text()

    return port, stop


def get(s: socket.socket, path: str, close: bool) -> tuple[bytes, bytes]:
    conn = "close" if close else "keep-alive"
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: {conn}\r\n\r\n".encode())
    f = s.makefile("rb")
    head = read_head(f)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, f.read(length)


def connection_adds(trace: str) -> int:
    """`EPOLL_CTL_ADD`s of accepted sockets (a descriptor counts from its accept4 to its
    close, since numbers are reused)."""
    open_fds, n = set(), 0
    for line in trace.splitlines():
        if m := re.search(r"accept4[ (].* = (\d+)$", line):
            open_fds.add(m[1])
        elif m := re.search(r"close\((\d+)\)", line):
            open_fds.discard(m[1])
        elif m := re.search(r"EPOLL_CTL_ADD, (\d+),", line):
            n += m[1] in open_fds
    return n


@pytest.mark.parametrize("sendfile", ["off", "on"])
def test_short_connections_are_never_registered(tmp_path, sendfile):
    big = os.urandom(32 * 1024 * 1024)
    # Past the size answered from memory: sent from the file (with sendfile(2) or read and
    # written), which the socket buffer of a loopback connection takes whole.
    mid = os.urandom(100 * 1024)
    files = {"small.txt": b"hello\n", "mid.bin": mid, "big.bin": big}
    port, stop = traced(tmp_path, files, http=f"sendfile {sendfile};")
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port)) as s:
            head, body = get(s, "/small.txt", close=True)
            assert head.startswith(b"HTTP/1.1 200") and body == b"hello\n"
            assert s.recv(1) == b"", "the connection should close after its answer"
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port)) as s:
            head, body = get(s, "/mid.bin", close=True)
            assert head.startswith(b"HTTP/1.1 200") and body == mid
            assert s.recv(1) == b"", "the connection should close after its answer"
    # A file bigger than the socket buffer may have to wait for the client (then it
    # registers; a client reading fast enough may spare it that), and arrives whole.
    with socket.create_connection(("127.0.0.1", port)) as s:
        head, body = get(s, "/big.bin", close=True)
        assert head.startswith(b"HTTP/1.1 200") and body == big
    # A keep-alive connection waits for its next request: it registers, and is served.
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(3):
            head, body = get(s, "/small.txt", close=False)
            assert head.startswith(b"HTTP/1.1 200") and body == b"hello\n"
    trace = stop()
    # One ADD for the keep-alive connection and at most one for the big file; none for the
    # 25 short connections, nor for wait_port's probe (it closes without a request: read at
    # accept, it is closed unregistered too).
    assert connection_adds(trace) in (1, 2), trace


def test_kept_upstream_connection_is_looked_at_only_after_an_event(tmp_path):
    closed = threading.Event()

    def behave(conn, head, body):
        conn.sendall(http_answer(head.split(b" ")[1]))
        if b" /bye " not in head:
            return "again"
        # Answer as if the connection stayed open, then close it (the server's idle timeout).
        conn.close()
        closed.set()
        return None

    app = HttpApp(behave)
    try:
        port, stop = traced(
            tmp_path,
            {},
            calls="recvfrom",
            http=f"upstream b {{ server 127.0.0.1:{app.port}; keepalive 4; }}",
            server="""location / { proxy_pass http://b; proxy_http_version 1.1;
                                   proxy_set_header Connection ""; }""",
        )
        for path in ["/1", "/2", "/3", "/4", "/5", "/bye"]:
            with socket.create_connection(("127.0.0.1", port)) as s:
                assert get(s, path, close=True)[1] == path.encode()
        assert closed.wait(10)
        with socket.create_connection(("127.0.0.1", port)) as s:
            assert get(s, "/after", close=True)[1] == b"/after"
        trace = stop()
    finally:
        app.close()
    looks = [line for line in trace.splitlines() if "MSG_PEEK" in line]
    # Six requests went on the kept connection with nothing come on it between them: no
    # look. The server's close was an event, so the seventh request looked, found the end
    # of the stream, and went on a new connection (not the dead one, then a retry).
    assert len(looks) == 1 and looks[0].endswith("= 0"), looks
    assert app.accepted == 2
    assert [h.split(b" ")[1] for _, h, _ in app.requests] == [
        b"/1", b"/2", b"/3", b"/4", b"/5", b"/bye", b"/after"
    ]


def test_proxied_short_connections_are_never_registered(tmp_path):
    def behave(conn, head, body):
        conn.sendall(http_answer(head.split(b" ")[1]))
        return "again"

    app = HttpApp(behave)
    try:
        port, stop = traced(
            tmp_path,
            {},
            http=f"upstream b {{ server 127.0.0.1:{app.port}; keepalive 4; }}",
            server="""location / { proxy_pass http://b; proxy_http_version 1.1;
                                   proxy_set_header Connection ""; }""",
        )
        for i in range(20):
            with socket.create_connection(("127.0.0.1", port)) as s:
                head, body = get(s, f"/{i}", close=True)
                assert head.startswith(b"HTTP/1.1 200") and body == f"/{i}".encode()
                assert s.recv(1) == b"", "the connection should close after its answer"
        trace = stop()
    finally:
        app.close()
    # The upstream connection is registered (it waits for its answers); no client's is:
    # each was read at accept, answered when the upstream's answer came, and closed.
    assert connection_adds(trace) == 0, trace
    assert app.accepted == 1
