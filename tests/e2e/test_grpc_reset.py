"""grpc_pass when the upstream ends its answer (trailers with END_STREAM) and then resets the
stream while the client is still sending its body, side by side with Debian's nginx: a reset
with NO_ERROR only stops the body (the trailers reach the client), one with an error fails
the answer (the client's stream is reset, no trailers), as nginx's grpc module judges them.

Both ends are raw HTTP/2 here, so that the upstream's frames go out exactly in that order.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="needs Debian's nginx")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS = 0, 1, 3, 4
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload


def frames(sock: socket.socket, until):
    """Frames as (type, flags, sid, payload) until `until(frames so far)` or EOF/timeout."""
    got, buf = [], b""
    try:
        while not until(got):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n = int.from_bytes(buf[:3], "big")
                got.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]))
                buf = buf[9 + n:]
    except (socket.timeout, ConnectionResetError):
        pass
    return got


class Upstream:
    """Answers each request with :status 200 and one DATA frame, then, once the request's
    first DATA frame is in, `grpc-status: 0` trailers and RST_STREAM with `reason` in one
    write, before the request's body has ended."""

    def __init__(self, reason: int):
        self.reason = reason
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.conn, args=(c,), daemon=True).start()

    def conn(self, c):
        with c:
            c.settimeout(10)
            preface = b""
            while len(preface) < len(PREFACE):
                chunk = c.recv(len(PREFACE) - len(preface))
                if not chunk:
                    return
                preface += chunk
            c.sendall(frame(SETTINGS, 0, 0))
            got = frames(c, lambda f: any(t == HEADERS for t, *_ in f))
            sid = next(s for t, _, s, _ in got if t == HEADERS)
            head = b"\x88" + b"\x0f\x10\x10application/grpc"  # :status 200, content-type
            trailers = b"\x00\x0bgrpc-status\x010"
            c.sendall(frame(SETTINGS, ACK, 0)
                      + frame(HEADERS, END_HEADERS, sid, head)
                      + frame(DATA, 0, sid, b"\x00\x00\x00\x00\x02hi"))
            # Once the client's first DATA is here (its body goes on), the trailers and the
            # reset in one write.
            if not any(t == DATA for t, *_ in got):
                frames(c, lambda f: any(t == DATA for t, *_ in f))
            c.sendall(frame(HEADERS, END_HEADERS | END_STREAM, sid, trailers)
                      + frame(RST_STREAM, 0, sid, struct.pack(">I", self.reason)))
            frames(c, lambda f: False)

    def stop(self):
        self.sock.close()


def call(port: int) -> tuple[bool, bool]:
    """A gRPC call whose body is not ended: (trailers came, the stream was reset with an
    error: a reset with NO_ERROR after the answer only asks the client to stop sending)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        # POST, http, :path /test.Svc/M, :authority localhost, content-type application/grpc,
        # te: trailers
        block = (b"\x83\x86\x04\x0b/test.Svc/M\x01\x09localhost"
                 b"\x0f\x10\x10application/grpc\x00\x02te\x08trailers")
        s.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, block)
                  + frame(DATA, 0, 1, b"\x00\x00\x00\x00\x02hi"))

        def ended(got):
            return any(sid == 1 and (t == RST_STREAM or (t == HEADERS and fl & END_STREAM))
                       for t, fl, sid, _ in got)

        got = frames(s, ended)
    heads = [fl for t, fl, sid, _ in got if t == HEADERS and sid == 1]
    errors = [p for t, _, sid, p in got if t == RST_STREAM and sid == 1 and p != bytes(4)]
    return any(fl & END_STREAM for fl in heads), bool(errors)


@pytest.mark.parametrize("reason,want", [(0, (True, False)), (8, (False, True))])
def test_reset_after_the_answer_as_nginx(tmp_path, reason, want):
    up = Upstream(reason)
    conf = PEER_MAIN + f"""
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{{port}} http2;
        location / {{ grpc_pass grpc://127.0.0.1:{up.port}; }}
    }}
}}
"""
    try:
        with side_by_side(tmp_path, conf) as (srv, nginx_port):
            got = call(srv.port)
            theirs = call(nginx_port)
            log = srv.error_log()
    finally:
        up.stop()
    assert got == theirs == want
    if reason:
        assert "upstream rejected request with error 8" in log
