"""`proxy_request_buffering off` (and `fastcgi_request_buffering off`): the client's body goes
upstream as it arrives. The clients are raw sockets that send part of a body, wait until the
upstream reports having it, and only then send the rest, so a body that was held back would
make the wait fail; the upstreams are raw servers that report every byte as it comes."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading

import pytest

from conftest import free_port, read_head, wait_until
from rawapps import Listener, end_request, http_answer, made, stdout
from test_http2 import PREFACE, frame, split_frames


class BodyWatcher(Listener):
    """An HTTP upstream that reads a request head, then its body byte by byte as it comes
    (Content-Length or chunked, kept raw in `raw`), and answers with the raw body. `closed`
    is set when the connection ends before the body does."""

    def __init__(self, answer: bool = True):
        self.answer = answer
        self.heads: list[bytes] = []
        self.raw = b""
        self.cond = threading.Condition()
        self.closed = threading.Event()
        self.accepted = 0
        super().__init__()

    def seen(self, n: int, deadline: float = 5.0) -> bool:
        """Wait until `n` raw body bytes have come (or the deadline)."""
        with self.cond:
            return self.cond.wait_for(lambda: len(self.raw) >= n, deadline)

    def serve(self, conn):
        self.accepted += 1
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = conn.recv(65536)
            if not got:
                self.closed.set()
                return
            buf += got
        head, rest = buf.split(b"\r\n\r\n", 1)
        self.heads.append(head)
        lower = head.lower()
        length = None
        for line in lower.split(b"\r\n")[1:]:
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        chunked = b"transfer-encoding: chunked" in lower

        def complete(raw):
            return raw.endswith(b"0\r\n\r\n") if chunked else len(raw) >= (length or 0)

        raw = rest
        with self.cond:
            self.raw = raw
            self.cond.notify_all()
        while not complete(raw):
            try:
                got = conn.recv(65536)
            except OSError:
                got = b""
            if not got:
                self.closed.set()
                conn.close()
                return
            raw += got
            with self.cond:
                self.raw = raw
                self.cond.notify_all()
        if self.answer:
            conn.sendall(http_answer(b"got:" + raw, keep=False))
        else:
            # Takes the body, then dies without answering.
            conn.close()
            return
        conn.close()


@pytest.fixture
def watcher():
    yield from made(BodyWatcher)


def open_client(srv):
    return socket.create_connection(("127.0.0.1", srv.port), timeout=10)


def answer(c) -> tuple[bytes, bytes]:
    """Status line + headers, and the body by Content-Length."""
    f = c.makefile("rb")
    head = read_head(f)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, f.read(length)


def test_a_length_body_reaches_the_upstream_before_the_client_sent_all_of_it(gannet, watcher):
    w = watcher()
    srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; }}")
    c = open_client(srv)
    c.sendall(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello")
    assert w.seen(5), "the first half was held back"
    assert b"content-length: 10" in w.heads[0].lower()
    c.sendall(b"world")
    head, body = answer(c)
    assert head.startswith(b"HTTP/1.1 200 ") and body == b"got:helloworld"
    c.close()


def test_with_buffering_on_the_upstream_gets_the_body_whole(gannet, watcher):
    w = watcher()
    srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{w.port}; }}")
    c = open_client(srv)
    c.sendall(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello")
    c.sendall(b"world")
    head, body = answer(c)
    assert body == b"got:helloworld"
    # Nothing reached the upstream before the body was whole: one connection, one head.
    assert w.accepted == 1
    c.close()


def test_a_chunked_body_passes_through_chunked_with_http_1_1(gannet, watcher):
    w = watcher()
    srv = gannet.start(server=f"""
        location / {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; proxy_http_version 1.1; }}
    """)
    c = open_client(srv)
    c.sendall(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    assert w.seen(len(b"5\r\nhello\r\n")), "the first chunk was held back"
    head = w.heads[0].lower()
    assert b"transfer-encoding: chunked" in head and b"content-length" not in head
    c.sendall(b"6\r\n world\r\n0\r\n\r\n")
    status, body = answer(c)
    assert status.startswith(b"HTTP/1.1 200 ")
    assert body == b"got:5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    c.close()


def test_a_chunked_body_to_an_http_1_0_upstream_is_buffered(gannet, watcher):
    w = watcher()
    srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; }}")
    c = open_client(srv)
    c.sendall(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    status, body = answer(c)
    assert body == b"got:hello world"
    assert b"content-length: 11" in w.heads[0].lower()
    c.close()


def test_an_over_limit_streamed_body_is_a_413_and_the_upstream_is_closed(gannet, watcher):
    w = watcher()
    srv = gannet.start(server=f"""
        client_max_body_size 10;
        location / {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; proxy_http_version 1.1; }}
    """)
    # Chunked: the first 6 bytes go up, the next 6 pass the limit.
    c = open_client(srv)
    c.sendall(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n")
    assert w.seen(len(b"6\r\nabcdef\r\n"))
    c.sendall(b"6\r\nghijkl\r\n0\r\n\r\n")
    status, _ = answer(c)
    assert status.startswith(b"HTTP/1.1 413 ")
    assert w.closed.wait(5), "the upstream connection was left open"
    assert wait_until(lambda: "client intended to send too large body" in srv.error_log())
    c.close()
    # A Content-Length over the limit is refused before any upstream is contacted.
    status, _, _ = srv.request("POST", "/big", body=b"x" * 11)
    assert status == 413
    assert w.accepted == 1


def test_a_client_that_stops_mid_body_closes_the_upstream_connection(gannet, watcher):
    w = watcher()
    srv = gannet.start(server=f"""
        location / {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; }}
        location /slow/ {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; client_body_timeout 1s; }}
    """)
    c = open_client(srv)
    c.sendall(b"POST /gone HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
    assert w.seen(10)
    c.close()
    assert w.closed.wait(5), "the upstream connection was left open"
    # A client that stays but sends nothing more: client_body_timeout ends it.
    w.closed.clear()
    c = open_client(srv)
    c.sendall(b"POST /slow/ HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
    assert w.closed.wait(10), "the upstream connection was left open"
    assert c.recv(100) == b""
    c.close()
    # The worker is fine.
    assert srv.get("/x", headers={"Content-Length": "0"})[0] == 200


def test_no_next_upstream_once_body_bytes_were_sent(gannet, watcher):
    taker = watcher(False)
    good = watcher()
    dead = free_port()
    srv = gannet.start(
        http=f"""upstream takes {{ server 127.0.0.1:{taker.port}; server 127.0.0.1:{good.port}; }}
                 upstream dead_first {{ server 127.0.0.1:{dead}; server 127.0.0.1:{good.port}; }}""",
        server="""
            proxy_request_buffering off;
            location /takes/ { proxy_pass http://takes; }
            location /dead/ { proxy_pass http://dead_first; }
        """,
    )
    # The first server took the body and died: PUT is idempotent, but its body is gone. (The
    # body comes in two parts: one that has all come with the head is kept whole, as nginx,
    # and could go to the next server.)
    with open_client(srv) as c:
        c.sendall(b"PUT /takes/ HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        assert taker.seen(5)
        c.sendall(b"56789")
        assert answer(c)[0].startswith(b"HTTP/1.1 502 ")
    assert good.accepted == 0
    # A connect failure happens before any body byte: the next server gets it all.
    status, _, body = srv.request("PUT", "/dead/", body=b"0123456789")
    assert status == 200 and body == b"got:0123456789"


class FastCgiWatcher(Listener):
    """A FastCGI application that reports each STDIN byte as it comes and answers with the
    body it got once the empty STDIN record arrives."""

    def __init__(self):
        self.stdin = b""
        self.params = b""
        self.cond = threading.Condition()
        super().__init__()

    def seen(self, n: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.stdin) >= n, 5)

    def serve(self, conn):
        buf = b""
        while True:
            while len(buf) < 8:
                got = conn.recv(65536)
                if not got:
                    return
                buf += got
            _, kind, _, length, padding, _ = struct.unpack(">BBHHBB", buf[:8])
            while len(buf) < 8 + length + padding:
                got = conn.recv(65536)
                if not got:
                    return
                buf += got
            content, buf = buf[8:8 + length], buf[8 + length + padding:]
            if kind == 4:
                self.params += content
            elif kind == 5 and content:
                with self.cond:
                    self.stdin += content
                    self.cond.notify_all()
            elif kind == 5:
                break
        conn.sendall(stdout(b"Content-Type: text/plain\r\n\r\ngot:" + self.stdin) + end_request())
        conn.close()


def h2_post(port: int, path: bytes, length: int | None, extra: bytes = b"") -> socket.socket:
    """An h2c connection with a POST's HEADERS sent (with `content-length: length`, or none,
    and the HPACK-encoded `extra` fields), its body still to come on stream 1."""
    block = b"\x83\x86\x04" + bytes([len(path)]) + path + b"\x01\x09localhost" + extra  # POST, http, path, authority
    if length is not None:
        value = str(length).encode()
        block += b"\x0f\x0d" + bytes([len(value)]) + value  # content-length (static name 28)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(PREFACE + frame(4, 0, 0, b"") + frame(1, 0x4, 1, block))  # END_HEADERS
    return s


def h2_answer(s: socket.socket, sid: int = 1) -> tuple[bytes, bytes]:
    """Stream `sid`'s HEADERS block and DATA, until its END_STREAM."""
    data, block, body = b"", b"", b""
    while True:
        got = s.recv(65536)
        assert got, "the connection ended before the answer did"
        frames, data = split_frames(data + got)
        for kind, flags, stream, payload in frames:
            assert not (stream == sid and kind == 3), "the stream was reset"
            if stream == sid and kind == 1:
                block += payload
            elif stream == sid and kind == 0:
                body += payload
            if stream == sid and kind in (0, 1) and flags & 1:
                return block, body


@pytest.mark.parametrize("length", [10, None], ids=["content-length", "no-length"])
def test_a_body_over_http2_reaches_the_upstream_as_it_arrives(gannet, watcher, length):
    w = watcher()
    srv = gannet.start(server=f"""http2 on;
        location / {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; proxy_http_version 1.1; }}""")
    s = h2_post(srv.port, b"/up", length)
    s.sendall(frame(0, 0, 1, b"hello"))
    # Without a length the body goes up chunked (HTTP/1.1 upstream).
    first = b"hello" if length else b"5\r\nhello\r\n"
    assert w.seen(len(first)), "the first half was held back"
    head = w.heads[0].lower()
    assert (b"content-length: 10" in head) if length else (b"transfer-encoding: chunked" in head)
    s.sendall(frame(0, 0, 1, b"") + frame(0, 1, 1, b"world"))  # an empty DATA frame, then the end
    block, body = h2_answer(s)
    assert block.startswith(b"\x88")  # :status 200
    assert body == b"got:helloworld" if length else body == b"got:5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n"
    s.close()


def test_an_over_limit_body_over_http2_is_a_413(gannet, watcher):
    w = watcher()
    srv = gannet.start(server=f"""http2 on; client_max_body_size 10;
        location / {{ proxy_pass http://127.0.0.1:{w.port}; proxy_request_buffering off; proxy_http_version 1.1; }}""")

    def post(*how: str) -> bytes:
        r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}", *how,
                            f"http://127.0.0.1:{srv.port}/big"], input=b"x" * 11, capture_output=True, timeout=30)
        return r.stdout

    # A content-length over the limit: refused before any upstream is contacted.
    assert post("--data-binary", "@-") == b"413"
    assert w.accepted == 0
    # No length (an upload from a pipe): passed on until it passes the limit, then 413 and the
    # upstream connection closed.
    assert post("-X", "POST", "-T", "-") == b"413"
    # `closed` is set by the upstream's thread after it counted the connection: waited for
    # first, so a busy machine's late accept() is not read as no connection.
    assert w.closed.wait(5), "the upstream connection was left open"
    assert w.accepted == 1
    assert wait_until(lambda: "client intended to send too large body while" in srv.error_log())


@pytest.mark.parametrize("length,answer", [(5, b"405 Not Allowed"), (100, b"413 Request Entity Too Large")],
                         ids=["static-file", "over-limit"])
def test_an_unwanted_body_over_http2_is_not_waited_for(gannet, length, answer):
    # A body nobody reads (a POST to a static file, answered 405 as nginx does; one whose
    # content-length is over the limit), from a client that waits for 100-continue before
    # sending it, must not hold the answer back until client_body_timeout: h2_post's socket
    # gives up at 10 s.
    srv = gannet.start(server="http2 on; client_body_timeout 60s; client_max_body_size 10;",
                       files={"f.txt": "file\n"})
    s = h2_post(srv.port, b"/f.txt", length, b"\x0f\x14\x0c100-continue")  # expect (static name 35)
    _, body = h2_answer(s)
    assert answer in body
    # The body the client goes on to send is read off, and the connection serves on.
    s.sendall(frame(0, 1, 1, b"x" * min(length, 10)))
    s.sendall(frame(1, 0x5, 3, b"\x82\x86\x04\x06/f.txt\x01\x09localhost"))  # GET, END_STREAM
    block, body = h2_answer(s, 3)
    assert block.startswith(b"\x88") and body == b"file\n"  # :status 200
    s.close()


def test_fastcgi_request_buffering_off_streams_stdin(gannet):
    app = FastCgiWatcher()
    try:
        srv = gannet.start(server=f"""
            location / {{ fastcgi_pass 127.0.0.1:{app.port}; fastcgi_request_buffering off;
                         fastcgi_param CONTENT_LENGTH $content_length; }}
        """)
        c = open_client(srv)
        c.sendall(b"POST /f HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello")
        assert app.seen(5), "the first half was held back"
        assert b"\x0e\x02CONTENT_LENGTH10" in app.params
        c.sendall(b"world")
        status, body = answer(c)
        assert status.startswith(b"HTTP/1.1 200 ") and body == b"got:helloworld"
        c.close()
    finally:
        app.close()


def test_buffering_directives_are_flags(gannet):
    for d in ("proxy_request_buffering", "fastcgi_request_buffering", "scgi_request_buffering", "uwsgi_request_buffering"):
        r = gannet.check(server=f"{d} maybe;")
        assert r.returncode != 0 and d in r.stderr
        assert gannet.check(server=f"{d} off;").returncode == 0
