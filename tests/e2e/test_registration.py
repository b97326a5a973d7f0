"""A cleartext connection enters the event loop (epoll) only when it has to wait
(`conn::transport::Plain`): a short connection whose request is there at accept and whose
answer fits the socket buffer costs no `epoll_ctl` at all, as in nginx. Checked by running
gannet under strace and counting its `epoll_ctl` calls per connection; every answer is
checked too, since the point is that the unregistered paths still serve correctly."""

import os
import re
import signal
import socket
import subprocess

from conftest import free_port, gannet_bin, read_head, wait_port, wait_until

CONF = """
worker_processes 1;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {tmp}/access.log;
    keepalive_timeout 30s;
    server {{
        listen 127.0.0.1:{port} deferred;
        root {root};
    }}
}}
"""


def traced(tmp, files):
    """gannet under strace; returns (port, stop) where stop() ends it and gives the trace."""
    root = tmp / "www"
    root.mkdir()
    for name, body in files.items():
        (root / name).write_bytes(body)
    port = free_port()
    conf = tmp / "gannet.conf"
    conf.write_text(CONF.format(tmp=tmp, port=port, root=root))
    out = tmp / "trace"
    proc = subprocess.Popen(
        ["strace", "-f", "-qq", "-e", "trace=epoll_ctl,accept4,close", "-o", str(out), str(gannet_bin()), "-c", str(conf)],
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


def test_short_connections_are_never_registered(tmp_path):
    big = os.urandom(4 * 1024 * 1024)
    port, stop = traced(tmp_path, {"small.txt": b"hello\n", "big.bin": big})
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port)) as s:
            head, body = get(s, "/small.txt", close=True)
            assert head.startswith(b"HTTP/1.1 200") and body == b"hello\n"
            assert s.recv(1) == b"", "the connection should close after its answer"
    # A file bigger than the socket buffer has to wait for the client: it registers, and
    # arrives whole.
    with socket.create_connection(("127.0.0.1", port)) as s:
        head, body = get(s, "/big.bin", close=True)
        assert head.startswith(b"HTTP/1.1 200") and body == big
    # A keep-alive connection waits for its next request: it registers, and is served.
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(3):
            head, body = get(s, "/small.txt", close=False)
            assert head.startswith(b"HTTP/1.1 200") and body == b"hello\n"
    trace = stop()
    # One ADD for the big file and one for the keep-alive connection; none for the 20
    # short connections, nor for wait_port's probe (it closes without a request: read at
    # accept, it is closed unregistered too).
    assert connection_adds(trace) == 2, trace
