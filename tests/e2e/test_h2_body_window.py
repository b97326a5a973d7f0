"""A request body's stream window as nginx keeps it: when a location reads the body whole,
nginx opens the stream's window to 2^31-1 at once (one WINDOW_UPDATE) and so takes a body
sent in one DATA frame past the initial 64k window right behind its HEADERS (nginx-tests'
grpc_request_buffering.t does that); where it does not (`proxy_request_buffering off`)
such a frame resets the stream with FLOW_CONTROL_ERROR. Raw HTTP/2 on both sides: the
client sends a 66,000-byte body as one frame, a gRPC back end that offers the default
window takes the first 65,535 bytes, answers its head, opens its window and gets the rest;
the answer comes back whole. Checked against Debian's nginx with the same config.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

import rawapps
from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
BODY = b"Hello" * 13200  # 66,000 bytes: past the 65,536 of the initial window
MAX_WINDOW = 2**31 - 1

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        client_max_body_size 8m;
        location /grpc {
            mirror /m;
            grpc_pass 127.0.0.1:GRPC;
        }
        location = /m { internal; return 204; }
        location /keep { proxy_pass http://127.0.0.1:APP; }
        location /off { proxy_pass http://127.0.0.1:APP; proxy_request_buffering off; }
    }
}
"""


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """A field without indexing, its name and value as plain strings."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


class Frames:
    """A socket's HTTP/2 frames, one by one."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def next(self) -> tuple[int, int, int, bytes]:
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionResetError
            self.buf += chunk
        n = int.from_bytes(self.buf[:3], "big")
        f = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF, self.buf[9 : 9 + n]
        self.buf = self.buf[9 + n :]
        return f


class GrpcBackend(rawapps.Listener):
    """A gRPC server that keeps to HTTP/2's default window: it reads the request's DATA up
    to 65,535 bytes before it says anything, then sends its SETTINGS and the answer's head,
    opens the stream's and the connection's windows, reads the rest and answers."""

    def __init__(self, opens: bool = True):
        # With `opens` false it answers (head, message, trailers) at once instead, its
        # window never opened: the rest of the body is never taken.
        self.opens = opens
        self.got: list[tuple[int, bytes]] = []  # (bytes before the window opened, body)
        super().__init__()

    def serve(self, conn):
        conn.settimeout(5)
        conn.recv(24, socket.MSG_WAITALL)
        frames, body, sid, early = Frames(conn), b"", 0, None
        while True:
            kind, flags, stream, payload = frames.next()
            if kind == HEADERS:
                sid = stream
            if kind == DATA:
                body += payload
            if early is None and (len(body) >= 65535 or (kind == DATA and flags & END_STREAM)):
                early = len(body)
                if not self.opens:
                    break
                head = b"\x88" + b"\x0f\x10\x10application/grpc"
                conn.sendall(
                    frame(SETTINGS, 0, 0, b"")
                    + frame(SETTINGS, ACK, 0, b"")
                    + frame(HEADERS, END_HEADERS, sid, head)
                    + frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", 65536))
                    + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 65536))
                )
            if kind == DATA and flags & END_STREAM:
                break
        self.got.append((early, body))
        if not self.opens:
            head = b"\x88" + b"\x0f\x10\x10application/grpc"
            conn.sendall(frame(SETTINGS, 0, 0, b"") + frame(SETTINGS, ACK, 0, b"") + frame(HEADERS, END_HEADERS, sid, head))
        message = b"\x00" + struct.pack(">I", 2) + b"ok"
        trailers = literal(b"grpc-status", b"0") + literal(b"grpc-message", b"")
        conn.sendall(frame(DATA, 0, sid, message) + frame(HEADERS, END_HEADERS | END_STREAM, sid, trailers))
        try:
            while frames.next():
                pass
        except (OSError, ConnectionResetError):
            pass


def start(s: socket.socket) -> "Frames":
    """The connection's preface and SETTINGS; then the server's SETTINGS and its connection
    WINDOW_UPDATE, as nginx's tests wait for them, and the SETTINGS acknowledged."""
    frames = Frames(s)
    s.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
    settings = window = False
    while not (settings and window):
        kind, flags, _, _ = frames.next()
        settings |= kind == SETTINGS and not flags & ACK
        window |= kind == WINDOW_UPDATE
    s.sendall(frame(SETTINGS, ACK, 0, b""))
    return frames


def call(port: int, path: bytes, body: bytes) -> dict:
    """`body` as one DATA frame right behind the HEADERS, as nginx's tests send it (the
    server's SETTINGS acknowledged first). What came back on the stream: its status, DATA,
    RST_STREAM code, and its WINDOW_UPDATE increments."""
    got = {"status": None, "data": b"", "reset": None, "windows": [], "trailers": False}
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        frames = start(s)
        # POST, http, :path (literal), :authority localhost, content-type, content-length.
        block = b"\x83\x86" + b"\x04" + bytes([len(path)]) + path + b"\x01\x09localhost"
        block += b"\x0f\x10\x10application/grpc" + b"\x0f\x0d" + bytes([len(str(len(body)))]) + str(len(body)).encode()
        s.sendall(frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, body))
        try:
            while True:
                kind, flags, sid, payload = frames.next()
                if kind == GOAWAY:
                    got["reset"] = "GOAWAY"
                    break
                if sid != 1:
                    continue
                if kind == WINDOW_UPDATE:
                    got["windows"].append(int.from_bytes(payload, "big"))
                if kind == RST_STREAM:
                    got["reset"] = int.from_bytes(payload, "big")
                    break
                if kind == HEADERS and got["status"] is None:
                    got["status"] = {0x88: 200, 0x8C: 400}.get(payload[0], payload[:4])
                elif kind == HEADERS:
                    got["trailers"] = True
                if kind == DATA:
                    got["data"] += payload
                if flags & END_STREAM:
                    break
        except (socket.timeout, ConnectionResetError):
            pass
    return got


@pytest.fixture
def backends():
    app = rawapps.HttpApp(lambda conn, head, body: conn.sendall(rawapps.http_answer(b"len:%d" % len(body), keep=False)))
    grpc = GrpcBackend()
    yield app, grpc
    app.close()
    grpc.close()


def test_body_past_the_initial_window_in_one_frame_as_nginx(tmp_path, backends):
    app, grpc = backends
    conf = CONF.replace("GRPC", str(grpc.port)).replace("APP", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        results = {}
        for name, port in (("gannet", srv.port), ("nginx", nginx_port)):
            results[name] = [call(port, path, BODY) for path in (b"/grpc", b"/keep", b"/off")]
    for name, (grpc_call, keep, off) in results.items():
        # Read whole (a mirror, a buffered proxy): the window is opened at once and the
        # frame taken.
        assert grpc_call["status"] == 200 and grpc_call["trailers"], (name, grpc_call)
        assert grpc_call["data"] == b"\x00\x00\x00\x00\x02ok", (name, grpc_call)
        assert grpc_call["windows"][:1] == [MAX_WINDOW - 65536], (name, grpc_call)
        assert keep["status"] == 200 and keep["data"] == b"len:66000", (name, keep)
        # Passed on as it comes: the window stays, the frame is a flow-control error.
        assert off["reset"] == 3 and off["status"] is None, (name, off)
    # Both times the gRPC server had the body whole, the first 65,535 bytes of it before
    # it opened its window.
    assert grpc.got == [(65535, BODY)] * 2, [(e, len(b)) for e, b in grpc.got]


def test_opened_window_takes_a_large_body_at_once(tmp_path, backends):
    """A client that keeps to the windows it is given: 64k, then, once the body is read
    whole, the stream's window opened by one WINDOW_UPDATE, and the rest (4 MiB in 16k
    frames) sent without waiting. gannet's codec still gives window back a piece at a time:
    what comes meanwhile waits its turn, and all of it reaches the application."""
    app, _ = backends
    conf = CONF.replace("GRPC", "1").replace("APP", str(app.port))
    body = bytes(range(256)) * (4 * 4096 + 1)
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for name, port in (("gannet", srv.port), ("nginx", nginx_port)):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                frames = start(s)
                n = str(len(body)).encode()
                block = b"\x83\x86\x04\x05/keep\x01\x09localhost\x0f\x0d" + bytes([len(n)]) + n
                first = [body[i : i + 16384] for i in range(0, 65536, 16384)]
                s.sendall(frame(HEADERS, END_HEADERS, 1, block) + b"".join(frame(DATA, 0, 1, p) for p in first))
                opened = 0
                while opened == 0:
                    kind, _, sid, payload = frames.next()
                    if kind == WINDOW_UPDATE and sid == 1:
                        opened = int.from_bytes(payload, "big")
                assert opened >= len(body), (name, opened)
                rest = [body[i : i + 16384] for i in range(65536, len(body), 16384)]
                wire = b"".join(frame(DATA, 0, 1, p) for p in rest[:-1]) + frame(DATA, END_STREAM, 1, rest[-1])
                sender = threading.Thread(target=s.sendall, args=(wire,))
                sender.start()
                status, data = None, b""
                while True:
                    kind, flags, sid, payload = frames.next()
                    if sid != 1:
                        continue
                    assert kind != RST_STREAM, (name, payload)
                    if kind == HEADERS:
                        status = payload[0]
                    if kind == DATA:
                        data += payload
                    if flags & END_STREAM:
                        break
                sender.join()
            assert (status, data) == (0x88, b"len:%d" % len(body)), (name, status, data)
    assert [b for _, _, b in app.requests] == [body, body]


def test_server_answering_before_taking_the_whole_body(tmp_path):
    """A gRPC server that answers (head, message, trailers) once it has the first 65,535
    bytes, never opening its window for the rest: as nginx (`preserve_output`), the answer
    is read while the body goes up and reaches the client at once."""
    grpc = GrpcBackend(opens=False)
    try:
        conf = CONF.replace("GRPC", str(grpc.port)).replace("APP", "1")
        with side_by_side(tmp_path, conf) as (srv, nginx_port):
            for name, port in (("gannet", srv.port), ("nginx", nginx_port)):
                got = call(port, b"/grpc", BODY)
                assert got["status"] == 200 and got["trailers"], (name, got)
                assert got["data"] == b"\x00\x00\x00\x00\x02ok", (name, got)
        assert [(e, len(b)) for e, b in grpc.got] == [(65535, 65535)] * 2
    finally:
        grpc.close()
