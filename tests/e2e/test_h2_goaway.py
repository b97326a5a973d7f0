"""HTTP/2 connection errors, GOAWAY frames and late header blocks as nginx's, on gannet and
Debian's nginx with one config, over raw frames: the error code and last stream of the
GOAWAY nginx ends a connection with (FRAME_SIZE_ERROR for a control frame of the wrong
size, PROTOCOL_ERROR for a client's PUSH_PROMISE at once, COMPRESSION_ERROR for a header
block its decoder stops on, with that block's stream as the last), the last stream a
graceful GOAWAY names (keepalive_requests, keepalive_time) with later streams ignored, and a
header block that does not come whole within client_header_timeout: its stream reset with
PROTOCOL_ERROR, the connection kept (`conn::h2_goaway`).
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 5, 6, 7, 8
# GET http://localhost/ from the static table and a plain :authority.
GET = b"\x82\x86\x84\x01\x09localhost"

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        client_header_timeout 1s;
        keepalive_requests 2;
        large_client_header_buffers 4 512;
        location / { return 200; }
    }
}
"""


def frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class Client:
    """A raw HTTP/2 connection: frames out as given, frames in as (kind, flags, sid, payload)."""

    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.s.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))

    def send(self, data: bytes) -> None:
        self.s.sendall(data)

    def until(self, want, wait: float = 5.0) -> list:
        """Frames until one `want(f)` is true (it is the last), the connection ends or `wait`
        seconds pass."""
        got, end = [], time.monotonic() + wait
        while True:
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                n = int.from_bytes(self.buf[:3], "big")
                f = (self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF, self.buf[9:9 + n])
                self.buf = self.buf[9 + n:]
                got.append(f)
                if want(f):
                    return got
            left = end - time.monotonic()
            if left <= 0:
                return got
            self.s.settimeout(left)
            try:
                chunk = self.s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                return got
            if not chunk:
                return got
            self.buf += chunk

    def goaway(self, wait: float = 5.0):
        """(last stream, code) of the first GOAWAY, or None."""
        for kind, _, _, p in self.until(lambda f: f[0] == GOAWAY, wait):
            if kind == GOAWAY:
                return (int.from_bytes(p[:4], "big") & 0x7FFFFFFF, int.from_bytes(p[4:8], "big"))
        return None

    def answered(self, sid: int, wait: float = 5.0) -> bool:
        """Whether stream `sid` gets an answer's HEADERS."""
        return any(k == HEADERS and s == sid for k, _, s, _ in self.until(lambda f: f[0] == HEADERS and f[2] == sid, wait))

    def close(self) -> None:
        self.s.close()


def goaway_after(port: int, data: bytes, first: bool = False):
    """The GOAWAY (last stream, code) after `data`, with a request on stream 1 answered
    first if `first`, and how long it took. (Debian's nginx 1.22 closes a connection idle
    after its streams without a GOAWAY on such errors; 1.25+ and gannet send it.)"""
    c = Client(port)
    try:
        if first:
            c.send(frame(HEADERS, 0x5, 1, GET))
            assert c.answered(1)
        start = time.monotonic()
        c.send(data)
        got = c.goaway()
        return got, time.monotonic() - start
    finally:
        c.close()


FRAME_ERRORS = {
    "goaway without its fields": frame(GOAWAY, 0, 0, b"\0" * 4 + b"\0\0\0\x05foobar", length=0),
    "ping of four bytes": frame(PING, 0, 0, b"abcd"),
    "settings of five bytes": frame(SETTINGS, 0, 0, b"\0\x03\0\0\0"),
    "settings ack with a payload": frame(SETTINGS, 1, 0, b"\0\x03\0\0\0\x01"),
    "window update of three bytes": frame(WINDOW_UPDATE, 0, 0, b"\0\0\x01"),
    "client's push promise, no payload yet": frame(PUSH_PROMISE, 0x4, 1, b"", length=4),
}


def test_frame_errors_as_nginx(tmp_path):
    """The GOAWAY code and last stream nginx ends a connection with for each bad frame, at
    once (a PUSH_PROMISE's payload is not waited for)."""
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = {k: goaway_after(srv.port, f) for k, f in FRAME_ERRORS.items()}
        want = {k: goaway_after(nginx_port, f) for k, f in FRAME_ERRORS.items()}
        # After a stream: the same codes, that stream the last (nginx 1.22 sends none then).
        later = {k: goaway_after(srv.port, f, first=True)[0] for k, f in FRAME_ERRORS.items()}
    codes = {k: g for k, (g, _) in got.items()}
    assert codes == {k: g for k, (g, _) in want.items()}
    assert codes["goaway without its fields"] == (0, 6)
    assert codes["client's push promise, no payload yet"] == (0, 1)
    assert later == {k: (1, code) for k, (_, code) in codes.items()}
    assert all(t < 2 for _, t in got.values()), got


HPACK_ERRORS = {
    # An indexed field of index 0 (RFC 7541 6.1).
    "zero index": frame(HEADERS, 0x5, 3, b"\x80"),
    # A table size update past SETTINGS_HEADER_TABLE_SIZE (4097).
    "table size 4097": frame(HEADERS, 0x5, 3, b"\x3f\xe2\x1f" + GET),
    # An index in five octets (nginx reads four at most).
    "too long index": frame(HEADERS, 0x5, 3, b"\xff\xff\xff\xff\x01"),
    # ... with the frame not all sent: nginx stops at the fourth octet.
    "too long index, frame not whole": frame(HEADERS, 0x5, 3, b"\xff\xff\xff\xff", length=5),
    # An integer, then a string, cut short by the block's end.
    "index cut short": frame(HEADERS, 0x5, 3, b"\xff"),
    "value cut short": frame(HEADERS, 0x5, 3, b"\x82\x86\x84\x01\x09local"),
    # A value longer than large_client_header_buffers' size.
    "field too long": frame(HEADERS, 0x5, 3, GET + b"\x00\x01a\x7f\x82\x04" + b"v" * 641),
}


def test_hpack_errors_as_nginx(tmp_path):
    """A header block nginx's decoder stops on ends the connection with its code and the
    block's stream as the last (the h2 crate alone says PROTOCOL_ERROR and stream 1, or
    waits for the rest of the frame)."""
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = {k: goaway_after(srv.port, f) for k, f in HPACK_ERRORS.items()}
        want = {k: goaway_after(nginx_port, f) for k, f in HPACK_ERRORS.items()}
    codes = {k: g for k, (g, _) in got.items()}
    assert codes == {k: g for k, (g, _) in want.items()}
    assert codes["zero index"] == (3, 9)
    assert codes["index cut short"] == (3, 6)
    assert codes["field too long"] == (3, 0xB)
    assert all(t < 2 for _, t in got.values()), got


def big_fields(count: int) -> bytes:
    """`count` fields of 4 + 450 bytes (each within large_client_header_buffers' 512)."""
    return b"".join(b"\x00\x04x-a" + bytes([0x30 + i]) + b"\x7f\xc3\x02" + b"v" * 450 for i in range(count))


def header_list(port: int, count: int):
    c = Client(port)
    try:
        c.send(frame(HEADERS, 0x5, 1, GET + big_fields(count)))
        frames = c.until(lambda f: f[0] in (HEADERS, GOAWAY))
        return [(k, int.from_bytes(p[:4], "big"), int.from_bytes(p[4:8], "big")) if k == GOAWAY else k
                for k, _, _, p in frames if k in (HEADERS, GOAWAY)]
    finally:
        c.close()


def test_header_list_limit_as_nginx(tmp_path):
    """large_client_header_buffers 4 512: a request whose names and values come to 1,869
    bytes is served (the h2 crate alone counts 32 more a field and answered 431), one of
    2,323 ends the connection with ENHANCE_YOUR_CALM naming its stream."""
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = [header_list(srv.port, n) for n in (4, 5)]
        want = [header_list(nginx_port, n) for n in (4, 5)]
    assert got == want == [[HEADERS], [(GOAWAY, 1, 0xB)]]


def late_headers(port: int):
    """A request whose HEADERS frame stops halfway for 1.5 s (client_header_timeout 1s):
    what stream 1 gets within that time, whether the connection still answers a PING once
    the rest came, and whether a request after it (its block indexing into what the late one
    added) is answered."""
    c = Client(port)
    try:
        # The late block adds x-a: b to the dynamic table; the next request names it (62).
        block = GET + b"\x40\x03x-a\x01b"
        whole = frame(HEADERS, 0x5, 1, block)
        c.send(whole[:20])
        start = time.monotonic()
        frames = c.until(lambda f: f[0] == RST_STREAM, wait=1.5)
        rst = [(s, int.from_bytes(p, "big")) for k, _, s, p in frames if k == RST_STREAM]
        took = time.monotonic() - start
        left = 1.5 - took
        if left > 0:
            c.until(lambda f: False, wait=left)
        c.send(whole[20:] + frame(PING, 0, 0, b"SEE-THIS"))
        pong = any(k == PING and fl & 1 for k, fl, _, _ in c.until(lambda f: f[0] == PING and f[1] & 1, 3))
        c.send(frame(HEADERS, 0x5, 3, GET + b"\xbe"))
        return rst, pong, c.answered(3, 3), took
    finally:
        c.close()


def test_late_header_block_resets_its_stream(tmp_path):
    """client_header_timeout over a request's header block: RST_STREAM PROTOCOL_ERROR on
    its stream, the connection kept and its HPACK table in step with the client's (the late
    block is decoded, its request not served)."""
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = late_headers(srv.port)
        want = late_headers(nginx_port)
    assert got[:3] == want[:3] == ([(1, 1)], True, True)
    assert got[3] < 1.4


def last_stream_of_graceful(port: int):
    """keepalive_requests 2: the GOAWAY after the second request's stream, and whether a
    third stream opened after it is answered."""
    c = Client(port)
    try:
        c.send(frame(HEADERS, 0x5, 1, GET))
        assert c.answered(1)
        c.send(frame(HEADERS, 0x5, 3, GET))
        g = c.goaway()
        c.send(frame(HEADERS, 0x5, 5, GET))
        return g, c.answered(5, wait=0.5)
    finally:
        c.close()


def test_graceful_goaway_names_the_last_stream(tmp_path):
    """The GOAWAY a connection ends gracefully with names the last stream taken (the h2
    crate's first one says 2^31-1 and takes new streams until its PING comes back), and a
    stream after it is ignored."""
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = last_stream_of_graceful(srv.port)
        want = last_stream_of_graceful(nginx_port)
    assert got == want == ((3, 0), False)


AGED_CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        keepalive_time 1s;
        location / { return 200; }
    }
}
"""


def aged(port: int):
    """keepalive_time 1s: a request at once (no GOAWAY), one after the connection's second
    (then a GOAWAY naming its stream)."""
    c = Client(port)
    try:
        c.send(frame(HEADERS, 0x5, 1, GET))
        first = c.until(lambda f: f[0] == HEADERS)
        early = c.goaway(wait=0.3)
        # keepalive_time is the connection's age: it has to pass.
        time.sleep(1.1)
        c.send(frame(HEADERS, 0x5, 3, GET))
        return bool(first), early, c.goaway()
    finally:
        c.close()


def test_keepalive_time_ends_the_connection_after_a_request(tmp_path):
    with side_by_side(tmp_path, AGED_CONF) as (srv, nginx_port):
        got = aged(srv.port)
        want = aged(nginx_port)
    assert got == want == (True, None, (3, 0))


BODY_CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        client_body_timeout 1s;
        # The body is read whole before the upstream is tried (never, here).
        location / { proxy_pass http://127.0.0.1:9; }
    }
}
"""


def late_body(port: int):
    """POST whose DATA frame stops after its first byte: the frames stream 1 gets, and
    whether the connection still answers a PING."""
    c = Client(port)
    try:
        data = frame(DATA, 0x1, 1, b"TEST")
        c.send(frame(HEADERS, 0x4, 1, b"\x83\x86\x04\x03/up\x01\x09localhost") + data[:10])
        start = time.monotonic()
        got = [(k, int.from_bytes(p, "big") if k == RST_STREAM else None)
               for k, _, s, p in c.until(lambda f: f[0] == RST_STREAM, wait=4)
               if s == 1 and k in (HEADERS, RST_STREAM)]
        took = time.monotonic() - start
        # The rest of the DATA frame, then a PING.
        c.send(data[10:] + frame(PING, 0, 0, b"SEE-THIS"))
        pong = any(k == PING and fl & 1 for k, fl, _, _ in c.until(lambda f: f[0] == PING and f[1] & 1, 3))
        return got, pong, took
    finally:
        c.close()


def test_late_body_resets_its_stream(tmp_path):
    """client_body_timeout while a body is read for an application: RST_STREAM
    PROTOCOL_ERROR and no answer (nginx finalizes the request with 408, which closes an
    HTTP/2 stream so), at once; the connection goes on."""
    with side_by_side(tmp_path, BODY_CONF) as (srv, nginx_port):
        got = late_body(srv.port)
        want = late_body(nginx_port)
    assert got[:2] == want[:2] == ([(RST_STREAM, 1)], True)
    assert got[2] < 1.9
