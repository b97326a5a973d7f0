"""An HTTP/2 upstream (`proxy_http_version 2`) that resets a stream after its answer's
end, in the same write, as nginx 1.29's HTTP/2 proxy judges it (nginx-tests'
proxy_h2_body_discard.t; Debian's 1.22 has no HTTP/2 proxy to compare with): one reset
NO_ERROR is the server saying it read enough of the body, and the answer stands; a second
reset, or one with an error, fails the answer (the client does not get its body)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from conftest import wait_until


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def rst(sid: int, code: int) -> bytes:
    return frame(3, 0, sid, struct.pack(">I", code))


class H2Server:
    """A raw HTTP/2 server: each request's answer is `:status 200`, DATA "SEE-THIS" with
    END_STREAM, then RST_STREAM frames with the `resets` codes, all in one write."""

    def __init__(self, resets: list[int]):
        self.resets = resets
        self.answered = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        with conn:
            data = b""
            while len(data) < 24:
                got = conn.recv(65536)
                if not got:
                    return
                data += got
            data = data[24:]
            conn.sendall(frame(4, 0, 0, b""))
            while True:
                while len(data) < 9 or len(data) < 9 + int.from_bytes(data[:3], "big"):
                    got = conn.recv(65536)
                    if not got:
                        return
                    data += got
                n = int.from_bytes(data[:3], "big")
                kind, flags, sid = data[3], data[4], int.from_bytes(data[5:9], "big")
                data = data[9 + n:]
                if kind == 4 and not flags & 1:
                    conn.sendall(frame(4, 1, 0, b""))
                if kind != 1:
                    continue
                answer = frame(1, 4, sid, b"\x88") + frame(0, 1, sid, b"SEE-THIS")
                answer += b"".join(rst(sid, c) for c in self.resets)
                conn.sendall(answer)
                self.answered += 1

    def close(self):
        self.sock.close()


CASES = {"none": [], "noerror": [0], "many": [0, 0], "error": [8]}


@pytest.fixture
def ups():
    s = {name: H2Server(codes) for name, codes in CASES.items()}
    yield s
    for u in s.values():
        u.close()


def get(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: t\r\n\r\n".encode())
        out = b""
        while got := s.recv(65536):
            out += got
    return out


def test_resets_after_the_answers_end(gannet, ups):
    locations = "".join(
        f"location /{name} {{ proxy_pass http://127.0.0.1:{u.port}; }}\n" for name, u in ups.items()
    )
    srv = gannet.start(server="proxy_http_version 2;\n" + locations)
    got = {name: get(srv.port, f"/{name}") for name in CASES}
    for name in ("none", "noerror"):
        assert got[name].endswith(b"\r\n\r\nSEE-THIS"), (name, got[name])
    for name in ("many", "error"):
        assert not got[name].endswith(b"SEE-THIS"), (name, got[name])
    assert all(u.answered == 1 for u in ups.values())
    assert wait_until(lambda: "upstream rejected request with error" in srv.error_log())
