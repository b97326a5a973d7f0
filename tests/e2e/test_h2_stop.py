"""A graceful stop (SIGQUIT) ends HTTP/2 connections as nginx's at exit, on gannet and Debian's
nginx with one config, over raw frames: a connection without streams is sent GOAWAY and
closed at once (the worker used to notice the stop at its next one-second check, then close
at the one after); one whose answer is still going out to a slow reader ends only once the
client has all of it - the reader, which sends WINDOW_UPDATEs as it reads, as browsers do,
gets every byte, the GOAWAY and a clean end, not a reset (`conn::h2`, `conn::h2_linger`).
"""

from __future__ import annotations

import signal
import socket
import struct
import time

import pytest

from conftest import Gannet, free_port
from nginx_peer import NGINX, PEER_MAIN, NginxPeer

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 7, 8
END_STREAM = 0x1
# GET http://localhost/big: :method GET, :scheme http, :path and :authority literal.
GET_BIG = b"\x82\x86\x04\x04/big\x01\x09localhost"
GET_SMALL = b"\x82\x86\x04\x06/small\x01\x09localhost"
BIG = 4 * 1024 * 1024

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        # A kernel send buffer of ~2 MB: most of the answer is in it when its stream ends.
        listen 127.0.0.1:{port} http2 sndbuf=1m;
        location / { root {root}; }
    }
    server {
        listen 127.0.0.1:{port2} http2 sndbuf=32k;
        send_timeout 1s;
        location / { root {root}; }
    }
}
"""


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class Reader:
    """A raw HTTP/2 client with a small receive buffer: frames in as (kind, flags, sid,
    payload), a WINDOW_UPDATE for what it has taken every so often."""

    def __init__(self, port: int):
        self.s = socket.socket()
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.s.settimeout(10)
        self.s.connect(("127.0.0.1", port))
        self.buf = b""
        self.unacked = 0
        self.eof = False
        self.reset = False
        # Stream windows of 1 MB, the connection's opened wide.
        settings = struct.pack(">HI", 0x4, 1 << 20)
        self.s.sendall(PREFACE + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30)))

    def request(self, sid: int, block: bytes) -> None:
        self.s.sendall(frame(HEADERS, 0x5, sid, block))

    def frames(self, until, pace: float = 0.0, deadline: float = 30.0) -> list:
        """Frames until `until(frames)` is true or the connection ends; with `pace`, reads
        16 KB at most every `pace` seconds (a slow reader)."""
        got, end = [], time.monotonic() + deadline
        while not until(got) and time.monotonic() < end:
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                n = int.from_bytes(self.buf[:3], "big")
                f = (self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF, self.buf[9:9 + n])
                self.buf = self.buf[9 + n:]
                got.append(f)
                if f[0] == DATA and n:
                    self.taken(f[2], n)
            if until(got) or self.eof:
                break
            if pace:
                time.sleep(pace)
            try:
                chunk = self.s.recv(16 * 1024)
            except ConnectionResetError:
                self.reset = self.eof = True
                break
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
        return got

    def taken(self, sid: int, n: int) -> None:
        """The window given back every 64 KB taken: bytes the server gets while it ends."""
        self.unacked += n
        if self.unacked >= 64 * 1024:
            inc = struct.pack(">I", self.unacked)
            try:
                self.s.sendall(frame(WINDOW_UPDATE, 0, 0, inc) + frame(WINDOW_UPDATE, 0, sid, inc))
            except OSError:
                pass
            self.unacked = 0

    def close(self) -> None:
        self.s.close()


def body_len(frames: list, sid: int) -> int:
    return sum(len(p) for k, _, s, p in frames if k == DATA and s == sid)


def ended(frames: list, sid: int) -> bool:
    return any(k == DATA and f & END_STREAM and s == sid for k, f, s, _ in frames)


def goaways(frames: list) -> list:
    return [(int.from_bytes(p[:4], "big") & 0x7FFFFFFF, int.from_bytes(p[4:8], "big")) for k, _, _, p in frames if k == GOAWAY]


def slow_reader_through_stop(port: int, proc) -> dict:
    """A 4 MB answer read at about 1 MB/s, the server told to stop once it has begun."""
    r = Reader(port)
    try:
        r.request(1, GET_BIG)
        got = r.frames(lambda fs: any(k == HEADERS for k, *_ in fs))
        proc.send_signal(signal.SIGQUIT)
        got += r.frames(lambda fs: False, pace=0.016)
        return {
            "body": body_len(got, 1),
            "ended": ended(got, 1),
            "goaway": (goaways(got) or [None])[0],
            "closed cleanly": r.eof and not r.reset,
        }
    finally:
        r.close()


def idle_through_stop(port: int, proc) -> tuple[dict, float]:
    """A connection whose one request was answered, kept open: what comes after the stop
    signal, and how long until the server closed it."""
    r = Reader(port)
    try:
        r.request(1, GET_SMALL)
        got = r.frames(lambda fs: ended(fs, 1))
        assert ended(got, 1)
        start = time.monotonic()
        proc.send_signal(signal.SIGQUIT)
        got = r.frames(lambda fs: False, deadline=10)
        took = time.monotonic() - start
        return {"goaway": goaways(got), "closed cleanly": r.eof and not r.reset}, took
    finally:
        r.close()


FILES = {"big": bytes(range(256)) * (BIG // 256), "small": "small\n"}


def run_both(tmp_path, check, second: bool = False):
    """`check(port, proc)` on gannet, then on nginx, each with the config and files; on the
    second server's port if `second`."""
    g = Gannet(tmp_path / "gannet")
    g.tmp.mkdir()
    root = g.write_files(FILES)
    ports = [free_port(), free_port()]
    conf = CONF.replace("{port2}", str(ports[1]))
    try:
        srv = g.start(conf=conf, port=ports[0])
        got = check(ports[second], srv.proc)
        assert srv.proc.wait(10) == 0
    finally:
        g.close()
    ports = [free_port(), free_port()]
    conf = CONF.replace("{port2}", str(ports[1]))
    nginx = NginxPeer(conf, ports[0], root, tmp_path / "nginx")
    try:
        want = check(ports[second], nginx.proc)
    finally:
        nginx.stop()
    return got, want


def test_slow_reader_gets_the_whole_answer_through_a_stop(tmp_path):
    """The stream's task has handed the end of the answer to the codec long before the client
    has read it (most of it waits in the kernel's send buffer): the stop waits for the
    client to take it all, and the WINDOW_UPDATEs the client sends meanwhile are read off,
    not answered with a reset that would throw the rest away."""
    got, want = run_both(tmp_path, slow_reader_through_stop)
    assert got == want == {"body": BIG, "ended": True, "goaway": (1, 0), "closed cleanly": True}


def test_idle_connection_ends_at_once_on_stop(tmp_path):
    """No stream running: GOAWAY naming the last stream, then the close, at once."""
    (got, took), (want, _) = run_both(tmp_path, idle_through_stop)
    assert got == want == {"goaway": [(1, 0)], "closed cleanly": True}
    # It used to take one to two one-second checks.
    assert took < 0.9


def reader_gone_through_stop(port: int, proc) -> tuple[dict, float]:
    """A 4 MB answer to a client that reads its head and nothing more: what it got, and
    how long the server took to exit after the stop signal."""
    r = Reader(port)
    try:
        r.request(1, GET_BIG)
        got = r.frames(lambda fs: any(k == HEADERS for k, *_ in fs))
        start = time.monotonic()
        proc.send_signal(signal.SIGQUIT)
        proc.wait(20)
        return {"answered": any(k == HEADERS for k, *_ in got)}, time.monotonic() - start
    finally:
        r.close()


def test_client_that_takes_nothing_is_dropped_after_send_timeout_on_stop(tmp_path):
    """The stream gives up at its send_timeout, and the connection, whose frames the
    client does not take, is dropped once nothing could be written for send_timeout more
    (nginx's send timer ends it): the stop does not wait the 5 s linger for it."""
    (got, took), (want, nginx_took) = run_both(tmp_path, reader_gone_through_stop, second=True)
    assert got == want == {"answered": True}
    assert took < 4, (took, nginx_took)
