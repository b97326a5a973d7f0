"""Applications on raw sockets, for tests whose application must misbehave or answer byte by
byte as the test says (no real one does on demand): a listener that serves each connection in
a thread, the FastCGI one built on it, and the fixture body that closes them all.

    @pytest.fixture
    def backend():
        yield from rawapps.made(rawapps.FastCgiApp)
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading


class Listener:
    """A TCP listener on a free loopback port; `serve(conn)` runs per connection."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                self.sock.close()
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            self.serve(conn)
        finally:
            conn.close()

    def serve(self, conn):
        raise NotImplementedError

    def close(self):
        """Stop listening and end every connection. Shut down, not closed: each socket is
        closed by the thread that uses it. Closed under a thread blocked on it, its
        descriptor number would go to the next socket this process opens, which that thread
        would then read and answer (seen: a finished test's application answering through
        a later test's upstream connection)."""
        for s in (self.sock, *self.conns):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def made(cls):
    """Fixture body: yields `make(*args)`, which starts a `cls(*args)`; all closed at the end."""
    listeners = []

    def make(*args):
        listener = cls(*args)
        listeners.append(listener)
        return listener

    yield make
    for listener in listeners:
        listener.close()


def record(kind: int, content: bytes, rid: int = 1) -> bytes:
    """One FastCGI record (6 = STDOUT, 7 = STDERR, 3 = END_REQUEST)."""
    return struct.pack(">BBHHBB", 1, kind, rid, len(content), 0, 0) + content


def stdout(data: bytes) -> bytes:
    """`data` as STDOUT records of at most 65535 bytes each."""
    return b"".join(record(6, data[i:i + 65535]) for i in range(0, len(data), 65535))


def end_request() -> bytes:
    return record(3, struct.pack(">IB3x", 0, 0))


class FastCgiApp(Listener):
    """Reads a request's records up to the empty STDIN record, then does `behave(conn)`; the
    connection is closed after, unless `behave` returns "again" (then it reads the next)."""

    END_OF_STDIN = b"\x01\x05\x00\x01\x00\x00\x00\x00"

    def __init__(self, behave):
        self.behave = behave
        super().__init__()

    def serve(self, conn):
        buf = b""
        while True:
            while self.END_OF_STDIN not in buf:
                got = conn.recv(65536)
                if not got:
                    return
                buf += got
            buf = buf[buf.index(self.END_OF_STDIN) + len(self.END_OF_STDIN):]
            try:
                if self.behave(conn) != "again":
                    conn.close()
                    return
            except OSError:
                return


def read_request(conn, buf: bytes = b"") -> tuple[bytes, bytes, bytes] | None:
    """One HTTP/1.x request off `conn`: (head, body, bytes after it), or None at the end of
    the connection. The body is read by its Content-Length (the proxy sends no other)."""
    while b"\r\n\r\n" not in buf:
        got = conn.recv(65536)
        if not got:
            return None
        buf += got
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        got = conn.recv(65536)
        if not got:
            return None
        rest += got
    return head, rest[:length], rest[length:]


class HttpApp(Listener):
    """An HTTP server that reads each request and calls `behave(conn, head, body)`; the
    connection is closed after, unless `behave` returns "again". `requests` keeps every head
    received with the number of the connection it came on; `ended` counts connections the
    client closed."""

    def __init__(self, behave):
        self.behave = behave
        self.requests: list[tuple[int, bytes, bytes]] = []
        self.accepted = 0
        self.ended = 0
        super().__init__()

    def serve(self, conn):
        self.accepted += 1
        n, buf = self.accepted, b""
        while True:
            try:
                got = read_request(conn, buf)
            except OSError:
                return
            if got is None:
                self.ended += 1
                conn.close()
                return
            head, body, buf = got
            self.requests.append((n, head, body))
            try:
                if self.behave(conn, head, body) != "again":
                    conn.close()
                    return
            except OSError:
                return


def http_answer(body: bytes, status: str = "200 OK", headers: str = "", keep: bool = True) -> bytes:
    """A Content-Length answer."""
    conn = "" if keep else "Connection: close\r\n"
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{conn}{headers}\r\n".encode() + body


class TlsHttpApp(HttpApp):
    """`HttpApp` over TLS with the server context `ctx` (Python's ssl module). Per
    connection it records the SNI name the client sent (None without one), and after each
    handshake whether the session was resumed and the client's certificate subject (empty
    without one); `failed` keeps the handshakes that failed."""

    def __init__(self, behave, ctx):
        self.ctx = ctx
        self.snis: list[str | None] = []
        self.handshakes: list[dict] = []
        self.failed: list[str] = []
        ctx.sni_callback = lambda _sock, name, _ctx: self.snis.append(name)
        super().__init__(behave)

    def serve(self, conn):
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as e:
            self.failed.append(str(e))
            conn.close()
            return
        peer = tls.getpeercert() or {}
        subject = dict(x[0] for x in peer.get("subject", ()))
        self.handshakes.append({"reused": tls.session_reused, "subject": subject, "version": tls.version()})
        super().serve(tls)
