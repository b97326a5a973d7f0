"""HTTP/2 stream priority and DATA framing as nginx's, on gannet and Debian's nginx with one
config, over raw sockets: once a window opens for several streams at once, their DATA goes
out by the dependency tree (lower rank first, then the heavier weight) that PRIORITY frames
and HEADERS priority fields built; a stream depending on itself ends the connection (GOAWAY
PROTOCOL_ERROR); what is left of a file after the window closed comes as one frame with
END_STREAM; frames are as large as `http2_chunk_size` and the client's
SETTINGS_MAX_FRAME_SIZE allow; and a client may send a stream's whole first window of body
in one DATA frame (nginx takes frames up to 2^24-1).
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, SETTINGS, GOAWAY, WINDOW_UPDATE = 0, 1, 2, 4, 7, 8
END_STREAM, END_HEADERS = 0x1, 0x4

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        root {root};
        http2_body_preread_size 128k;
        location /upload { return 204; }
        location /big/ {
            http2_chunk_size 64k;
            output_buffers 2 1m;
        }
    }
}
"""

# 2^16 + 80 bytes: 81 more than a stream's first window.
T1 = b"".join(b"X%04dXXX" % i for i in range(1, 8203))
FILES = {"t1.html": T1, "t2.html": b"SEE-THIS", "big/t1.html": T1}


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class Client:
    """A raw HTTP/2 client: frames out, frames in (type, flags, stream, payload)."""

    def __init__(self, port: int, settings: bytes = b""):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.sent_sid = -1
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def send(self, data: bytes):
        self.s.sendall(data)

    def get(self, path: bytes, prio: tuple[int, int, bool] | None = None) -> int:
        """GET `path` on the next stream; `prio`: (depends on, weight, exclusive)."""
        self.sent_sid += 2
        block = b"\x82\x86\x04" + bytes([len(path)]) + path + b"\x01\x09localhost"
        flags = END_STREAM | END_HEADERS
        if prio is not None:
            dep, weight, excl = prio
            block = struct.pack(">IB", dep | (excl << 31), weight - 1) + block
            flags |= 0x20
        self.send(frame(HEADERS, flags, self.sent_sid, block))
        return self.sent_sid

    def priority(self, sid: int, dep: int, weight: int, excl: bool = False):
        self.send(frame(PRIORITY, 0, sid, struct.pack(">IB", dep | (excl << 31), weight - 1)))

    def window(self, n: int, sid: int = 0):
        self.send(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", n)))

    def read_until(self, done) -> list[tuple[int, int, int, bytes]]:
        """Frames until `done(frames)` holds (server SETTINGS acked as they come)."""
        frames = []
        deadline = time.monotonic() + 5
        while not done(frames):
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                n = int.from_bytes(self.buf[:3], "big")
                f = (self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF, self.buf[9:9 + n])
                self.buf = self.buf[9 + n:]
                if f[0] == SETTINGS and not f[1] & 1:
                    self.send(frame(SETTINGS, 1, 0, b""))
                frames.append(f)
                if done(frames):
                    return frames
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; got {[(f[0], f[2], len(f[3])) for f in frames]}")
            chunk = self.s.recv(65536)
            if not chunk:
                return frames
            self.buf += chunk
        return frames

    def data_until_end(self, *sids: int) -> list[tuple[int, int, int]]:
        """DATA frames (stream, length, flags) until each of `sids` ended."""
        def done(frames):
            ended = {f[2] for f in frames if f[1] & END_STREAM}
            return all(s in ended for s in sids)
        return [(f[2], len(f[3]), f[1]) for f in self.read_until(done) if f[0] == DATA]

    def first_window(self, sid: int) -> int:
        """Read stream `sid`'s DATA until the first window (65535) is spent."""
        got = []

        def done(frames):
            got[:] = [len(f[3]) for f in frames if f[0] == DATA and f[2] == sid]
            return sum(got) >= 65535
        self.read_until(done)
        return sum(got)

    def headers_of(self, sid: int):
        self.read_until(lambda frames: any(f[0] == HEADERS and f[2] == sid for f in frames))

    def goaway(self) -> tuple[int, int] | None:
        """The GOAWAY's last stream and error code, None if the connection ended without."""
        try:
            frames = self.read_until(lambda frames: any(f[0] == GOAWAY for f in frames))
        except (AssertionError, ConnectionResetError):
            return None
        for f in frames:
            if f[0] == GOAWAY:
                return struct.unpack(">II", f[3][:8])
        return None


def two_streams(port: int, prio1=None, prio3=None, before=(), after=()) -> list[tuple[int, int, int]]:
    """/t1.html on stream 1 spends the connection's window; /t2.html on stream 3 waits;
    PRIORITY frames `before` the requests and `after` them; then both windows open at
    once: the DATA frames that follow."""
    c = Client(port)
    for p in before:
        c.priority(*p)
    sid = c.get(b"/t1.html", prio1)
    assert c.first_window(sid) == 65535
    sid2 = c.get(b"/t2.html", prio3)
    c.headers_of(sid2)
    for p in after:
        c.priority(*p)
    c.window(2**17, sid)
    c.window(2**17, sid2)
    c.window(2**17)
    return c.data_until_end(sid, sid2)


CASES = {
    "PRIORITY weights": dict(after=[(1, 0, 1), (3, 0, 256)]),
    "PRIORITY weights reversed": dict(after=[(1, 0, 256), (3, 0, 1)]),
    "HEADERS weights": dict(prio1=(0, 1, False), prio3=(0, 256, False)),
    "HEADERS weights reversed": dict(prio1=(0, 256, False), prio3=(0, 1, False)),
    "idle streams' dependency": dict(before=[(3, 0, 16), (1, 3, 16)]),
    "idle streams' dependency reversed": dict(before=[(1, 0, 16), (3, 1, 16)]),
    "HEADERS dependency over PRIORITY": dict(before=[(1, 0, 16), (3, 0, 16)], prio1=(3, 16, False)),
    "HEADERS dependency over PRIORITY reversed": dict(before=[(1, 0, 16), (3, 0, 16)], prio3=(1, 16, False)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_data_order_follows_priority_as_nginx(tmp_path, case):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        got = two_streams(srv.port, **CASES[case])
        want = two_streams(nginx_port, **CASES[case])
    # One frame each: the rest of t1 (81 bytes) and t2 (8), each ending its stream.
    assert sorted(want) == [(1, 81, END_STREAM), (3, 8, END_STREAM)]
    assert got == want


def test_weighted_dependencies_as_nginx(tmp_path):
    def run(port, w1, w3):
        c = Client(port)
        c.priority(5, 0, 16)
        c.priority(1, 5, w1)
        c.priority(3, 5, w3)
        sid = c.get(b"/t1.html")
        c.first_window(sid)
        for s in (c.get(b"/t2.html"), c.get(b"/t2.html")):
            c.headers_of(s)
        for s in (1, 3, 5):
            c.window(2**16, s)
        c.window(2**16)
        return [d[0] for d in c.data_until_end(1, 3, 5)]

    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for w1, w3 in ((256, 1), (1, 256)):
            want = run(nginx_port, w1, w3)
            assert want == ([5, 1, 3] if w1 > w3 else [5, 3, 1])
            assert run(srv.port, w1, w3) == want


def test_self_dependency_ends_the_connection_as_nginx(tmp_path):
    def priority_frame(port):
        c = Client(port)
        sid = c.get(b"/t2.html")
        c.data_until_end(sid)
        c.priority(sid, sid, 1)
        return c.goaway()

    def headers(port):
        c = Client(port)
        c.get(b"/t2.html", (1, 16, False))
        return c.goaway()

    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for case, want in ((priority_frame, (1, 1)), (headers, (0, 1))):
            assert case(nginx_port) == want
            assert case(srv.port) == want, case.__name__


def test_reprioritized_closed_and_circular_dependencies(tmp_path):
    """Streams depending on closed ones, made circular by later PRIORITY frames after the
    closed node was dropped: the rest of each file still comes, as one frame."""
    def run(port):
        c = Client(port)
        c.window(2**18)
        c.priority(1, 0, 16)
        c.priority(3, 1, 16)
        c.priority(5, 3, 16)
        sids = [c.get(b"/t1.html") for _ in range(3)]
        for s in sids:
            assert c.first_window(s) == 65535
        c.window(2**16, 3)
        assert c.data_until_end(3) == [(3, 81, END_STREAM)]
        for _ in range(40):
            c.data_until_end(c.get(b"/t2.html"))
        c.priority(1, 5, 16)
        c.priority(5, 1, 16)
        c.window(2**16, 1)
        c.window(2**16, 5)
        return sorted(c.data_until_end(1, 5))

    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        want = run(nginx_port)
        assert want == [(1, 81, END_STREAM), (5, 81, END_STREAM)]
        assert run(srv.port) == want


def test_frames_follow_the_clients_max_frame_size(tmp_path):
    """`http2_chunk_size 64k`: frames as large as the client's SETTINGS_MAX_FRAME_SIZE;
    and when one SETTINGS both opens the window and raises the frame size, the frames that
    follow are of the new size."""
    def custom(port):
        c = Client(port, struct.pack(">HI", 5, 2**15))
        sid = c.get(b"/big/t1.html")
        c.window(2**18, sid)
        c.window(2**18)
        return [d[1] for d in c.data_until_end(sid)][0]

    def both_at_once(port):
        c = Client(port, struct.pack(">HI", 4, 42))
        c.window(2**17)
        sid = c.get(b"/big/t1.html")
        c.read_until(lambda fs: sum(len(f[3]) for f in fs if f[0] == DATA) >= 42)
        c.send(frame(SETTINGS, 0, 0, struct.pack(">HIHI", 4, 2**17, 5, 2**15)))
        return [d[1] for d in c.data_until_end(sid)]

    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        assert custom(nginx_port) == custom(srv.port) == 2**15
        want = both_at_once(nginx_port)
        assert want == [32768, 32768, 38]
        assert both_at_once(srv.port) == want


def test_a_whole_window_of_body_in_one_frame_as_nginx(tmp_path):
    """A 65,550-byte DATA frame (the stream's window is `http2_body_preread_size` 128k):
    taken, where a 32k frame limit (the header cap) ended the connection."""
    def run(port):
        c = Client(port)
        c.read_until(lambda fs: any(f[0] == WINDOW_UPDATE and f[2] == 0 for f in fs))
        block = b"\x83\x86\x04\x07/upload\x01\x09localhost"  # POST
        c.send(frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, b"x" * 65550))
        frames = c.read_until(lambda fs: any(f[0] in (HEADERS, GOAWAY) for f in fs))
        return [(f[0], f[3][:1]) for f in frames if f[0] in (HEADERS, GOAWAY)]

    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        want = run(nginx_port)
        assert want == [(HEADERS, b"\x89")]  # :status 204, indexed
        assert run(srv.port) == want
