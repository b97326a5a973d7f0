"""HTTP/1.x on the wire: connection persistence, pipelining, request-target handling,
refusal of malformed or oversized requests, request bodies on static resources, and the
connection-level directives (keepalive_timeout, keepalive_requests, client_max_body_size,
server_tokens). nginx 1.22 is the reference for every status and for when the connection
closes.
"""

from __future__ import annotations

import email.utils
import socket
import struct
import time

import pytest

from nginx_peer import NGINX, PEER_MAIN, side_by_side

FILES = {"a.txt": "hello", "a b.txt": "a b", "x/b.txt": "bee"}


def req(target: str = "/a.txt", *headers: str, method: str = "GET", version: str = "HTTP/1.1",
        host: str | None = "x", body: bytes = b"") -> bytes:
    """A raw request; `host=None` leaves out the Host header."""
    lines = [f"{method} {target} {version}"] + ([f"Host: {host}"] if host is not None else []) + list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_one(buf: bytes, no_body: bool = False):
    """Split one response off `buf`: ((status, headers, body), rest), or None if incomplete.
    Headers are a lower-case dict; the body is framed by Content-Length."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buf[:end].decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), f"not a status line: {lines[0][:100]!r}"
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if no_body or status in (204, 304) or status < 200 else int(headers.get("content-length", 0))
    start = end + 4
    if len(buf) < start + length:
        return None
    return (status, headers, buf[start:start + length]), buf[start + length:]


def parse_all(buf: bytes) -> list:
    """Every complete response in `buf` (none of them to HEAD)."""
    out = []
    while (r := parse_one(buf)) is not None:
        resp, buf = r
        out.append(resp)
    assert buf == b"", f"trailing bytes after the responses: {buf[:200]!r}"
    return out


class Client:
    """One raw connection that reads responses one at a time and can tell a close apart
    from silence."""

    def __init__(self, port: int, timeout: float = 5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> "Client":
        self.sock.sendall(data)
        return self

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(65536)
        except ConnectionResetError:
            return b""

    def response(self, no_body: bool = False, skip_interim: bool = True):
        while True:
            r = parse_one(self.buf, no_body)
            if r is not None:
                resp, self.buf = r
                if skip_interim and resp[0] < 200:
                    continue
                return resp
            data = self._recv()
            assert data, f"connection closed before a full response; got {self.buf[:300]!r}"
            self.buf += data

    def closed(self, within: float = 3.0) -> bool:
        """True if the server closes (EOF) within `within` seconds with nothing more sent."""
        self.sock.settimeout(within)
        try:
            data = self._recv()
        except socket.timeout:
            return False
        assert data == b"", f"unexpected bytes instead of a close: {data[:200]!r}"
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def srv(gannet):
    return gannet.start(files=FILES)


@pytest.fixture
def client():
    """Factory of raw connections, closed at teardown: `client(srv.port)`."""
    clients = []

    def make(port: int, timeout: float = 5.0) -> Client:
        clients.append(Client(port, timeout))
        return clients[-1]

    yield make
    for c in clients:
        c.close()


# --- persistence -------------------------------------------------------------------------

def test_keepalive_two_requests_on_one_connection(srv, client):
    c = client(srv.port)
    for _ in range(2):
        status, h, body = c.send(req("/a.txt")).response()
        assert (status, body) == (200, b"hello")
        assert h["connection"] == "keep-alive"
    assert not c.closed(within=0.3)


def test_http10_without_keepalive_closes(srv, client):
    c = client(srv.port)
    status, h, body = c.send(req("/a.txt", version="HTTP/1.0", host=None)).response()
    assert (status, body, h["connection"]) == (200, b"hello", "close")
    assert c.closed()


def test_http10_with_keepalive_stays_open(srv, client):
    c = client(srv.port)
    status, h, _ = c.send(req("/a.txt", "Connection: keep-alive", version="HTTP/1.0", host=None)).response()
    assert status == 200 and h["connection"] == "keep-alive"
    status, _, body = c.send(req("/x/b.txt", "Connection: keep-alive", version="HTTP/1.0", host=None)).response()
    assert (status, body) == (200, b"bee")


def test_connection_close_honoured(srv, client):
    c = client(srv.port)
    status, h, body = c.send(req("/a.txt", "Connection: close")).response()
    assert (status, body, h["connection"]) == (200, b"hello", "close")
    assert c.closed()


def test_head_has_length_but_no_body(srv, client):
    c = client(srv.port)
    status, h, body = c.send(req("/a.txt", method="HEAD")).response(no_body=True)
    assert status == 200 and h["content-length"] == "5" and h["content-type"] == "text/plain"
    # Had a body followed the HEAD answer, it would be read as the next status line.
    status, _, body = c.send(req("/x/b.txt")).response()
    assert (status, body) == (200, b"bee")


def test_pipelined_ten_requests_answered_in_order(srv, client):
    names = [f"p{i}.txt" for i in range(10)]
    for i, n in enumerate(names):
        (srv.root / n).write_text(f"body-{i}-" + "z" * i)
    c = client(srv.port)
    c.send(b"".join(req(f"/{n}") for n in names))
    bodies = [c.response()[2] for _ in names]
    assert bodies == [f"body-{i}-{'z' * i}".encode() for i in range(10)]


# --- the request target ----------------------------------------------------------------------

def test_absolute_form_target(srv):
    out = parse_all(srv.raw(req(f"http://127.0.0.1:{srv.port}/x/b.txt", "Connection: close")))
    assert [(s, b) for s, _, b in out] == [(200, b"bee")]


def test_percent_decoding(srv):
    status, _, body = srv.get("/a%20b.txt")
    assert (status, body) == (200, b"a b")


@pytest.mark.parametrize("target", ["/x/../a.txt", "//a.txt", "/./a.txt", "/x/%2e%2e/a.txt"])
def test_path_normalisation(srv, target):
    out = parse_all(srv.raw(req(target, "Connection: close")))
    assert [(s, b) for s, _, b in out] == [(200, b"hello")]


@pytest.mark.parametrize("target", ["/../gannet.conf", "/%2e%2e/gannet.conf", "/x/../../gannet.conf", "/%2E%2E/gannet.conf"])
def test_dotdot_above_root_is_400(srv, client, target):
    # gannet.conf sits one level above the document root: it must never be reached.
    c = client(srv.port)
    status, _, body = c.send(req(target)).response()
    assert status == 400
    assert b"listen" not in body
    assert c.closed()


# --- malformed requests: answered, then the connection is closed -----------------------------

MALFORMED = {
    "bad request line": (b"GARBAGE\r\n\r\n", {400}),
    "bad method char": (b"GE(T /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", {400}),
    "content-length and chunked": (req("/a.txt", "Content-Length: 5", "Transfer-Encoding: chunked"), {400}),
    "duplicate content-length": (req("/a.txt", "Content-Length: 0", "Content-Length: 0"), {400}),
    "obs-fold": (req("/a.txt", "X-A: one", "  folded"), {400}),
    "no host on 1.1": (req("/a.txt", host=None), {400}),
    "http/2.0 request line": (req("/a.txt", version="HTTP/2.0"), {505}),
    "unknown transfer-encoding": (req("/a.txt", "Transfer-Encoding: gzip"), {501}),
    "uri over 8k": (req("/" + "a" * 9000), {414}),
    # nginx sends 400 "Request Header Or Cookie Too Large"; RFC 6585 has 431.
    "header over 8k": (req("/a.txt", "X-Long: " + "b" * 9000), {431, 400}),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_request_answered_then_closed(srv, client, name):
    data, statuses = MALFORMED[name]
    c = client(srv.port)
    # A valid request queued behind the bad one must not be answered.
    status, h, _ = c.send(data + req("/a.txt")).response()
    assert status in statuses
    assert h["connection"] == "close"
    assert c.closed()


# --- request bodies on a static resource -------------------------------------------------------

def test_content_length_body_on_get_is_discarded(srv, client):
    c = client(srv.port)
    c.send(req("/a.txt", "Content-Length: 11", body=b"GET /nope 1") + req("/x/b.txt"))
    assert c.response()[::2] == (200, b"hello")
    assert c.response()[::2] == (200, b"bee")


def test_chunked_body_on_get_is_discarded(srv, client):
    c = client(srv.port)
    body = b"5\r\nGET /\r\n6;ext=1\r\nnope 1\r\n0\r\nTrailer: x\r\n\r\n"
    c.send(req("/a.txt", "Transfer-Encoding: chunked", body=body) + req("/x/b.txt"))
    assert c.response()[::2] == (200, b"hello")
    assert c.response()[::2] == (200, b"bee")


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_unwanted_body_still_coming_is_not_waited_for_as_nginx(tmp_path, client):
    # A GET with a body nobody wants is answered before the body has come; the body is
    # read off afterwards, and the next request on the connection is served, as in nginx.
    conf = PEER_MAIN + """
http {
    access_log off;
    server { listen 127.0.0.1:{port}; root {root}; }
}
"""
    with side_by_side(tmp_path, conf, files=FILES) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            c = client(port, timeout=3)
            c.send(req("/a.txt", "Content-Length: 11"))
            assert c.response()[::2] == (200, b"hello"), port
            c.send(b"GET /nope 1" + req("/x/b.txt"))
            assert c.response()[::2] == (200, b"bee"), port


def test_expect_continue_post_gets_final_405(srv, client):
    c = client(srv.port, timeout=3.0)
    status, _, _ = c.send(req("/a.txt", "Content-Length: 5", "Expect: 100-continue", method="POST")).response()
    assert status == 405


# --- connection directives -------------------------------------------------------------------

def test_keepalive_timeout_closes_idle_connection(gannet, client):
    srv = gannet.start(files=FILES, server="keepalive_timeout 1s;")
    c = client(srv.port)
    assert c.send(req("/a.txt")).response()[0] == 200
    started = time.monotonic()
    assert c.closed(within=5.0)
    assert 0.5 <= time.monotonic() - started < 4.0


def test_keepalive_requests_closes_after_n(gannet, client):
    srv = gannet.start(files=FILES, server="keepalive_requests 3;")
    c = client(srv.port)
    c.send(req("/a.txt") * 4)
    conns = [c.response()[1]["connection"] for _ in range(3)]
    assert conns == ["keep-alive", "keep-alive", "close"]
    assert c.closed()


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_client_max_body_size_exceeded_is_413(gannet, client, method):
    srv = gannet.start(files=FILES, server="client_max_body_size 1k;")
    c = client(srv.port)
    status, h, _ = c.send(req("/a.txt", "Content-Length: 2000", method=method)).response()
    assert status == 413
    assert h["connection"] == "close"


def test_body_within_client_max_body_size_is_accepted(gannet):
    srv = gannet.start(files=FILES, server="client_max_body_size 1k;")
    out = parse_all(srv.raw(req("/a.txt", "Content-Length: 1000", "Connection: close", body=b"q" * 1000)))
    assert [(s, b) for s, _, b in out] == [(200, b"hello")]


def test_server_tokens_off_hides_version(gannet):
    srv = gannet.start(files=FILES, server="server_tokens off;")
    _, h, _ = srv.get("/a.txt")
    assert h["server"] == "gannet"
    status, h, body = srv.get("/missing")
    assert status == 404 and h["server"] == "gannet"
    assert b"0." not in body and b"gannet</center>" in body


def test_server_tokens_on_shows_version(srv):
    _, h, _ = srv.get("/a.txt")
    assert h["server"].startswith("gannet/") and h["server"][7:8].isdigit()


def test_date_header_present_and_valid(srv):
    _, h, _ = srv.get("/a.txt")
    assert h["date"].endswith(" GMT")
    date = email.utils.parsedate_to_datetime(h["date"])
    assert abs(date.timestamp() - time.time()) < 5
    # The exact IMF-fixdate shape: "Sun, 06 Nov 1994 08:49:37 GMT".
    assert email.utils.format_datetime(date, usegmt=True) == h["date"]


# --- the close after an answer ----------------------------------------------------------------

CLOSE_CONF = r"""
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    server { listen 127.0.0.1:{port}; root {root}; }
}
"""


def segments_received(port: int, request: bytes) -> int:
    """The TCP segments a client received on one connection (`tcpi_segs_in`, Linux's
    TCP_INFO), read once the server's close has arrived."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(request)
        while s.recv(65536):
            pass
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 192)
        return struct.unpack_from("I", info, 140)[0]
    finally:
        s.close()


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_closing_answer_and_fin_share_a_segment_as_in_nginx(tmp_path):
    # nginx (tcp_nopush) closes its socket corked: the answer and the FIN leave as one
    # segment. gannet sends a closing connection's last answer with MSG_MORE so the close
    # puts its FIN on it; it used to send them apart (a segment more per connection, and
    # an ACK more from the client). The fewest over a few connections: a delayed ACK of the
    # request may add one on a slow run.
    with side_by_side(tmp_path, PEER_MAIN + CLOSE_CONF, files=FILES) as (srv, nginx_port):
        r = req("/a.txt", "Connection: close")
        got = [min(segments_received(port, r) for _ in range(5)) for port in (srv.port, nginx_port)]
    assert got[0] == got[1], f"gannet {got[0]} segments, nginx {got[1]}"


def test_kept_small_files_whole_whichever_way_they_are_written(gannet, client):
    # Files the open file cache keeps in memory: up to 1 KiB copied after the head, larger
    # ones written with the head in one writev on a kept connection, and copied again when
    # pipelined requests wait or the connection closes after the answer (conn/h1.rs,
    # COPY_ALWAYS). Each way, every answer whole and in order.
    sizes = [600, 3000, 8000, 20000]
    files = {f"s{n}.txt": "".join(chr(97 + (i * 7 + n) % 26) for i in range(n)) for n in sizes}
    srv = gannet.start(files=files, http="open_file_cache max=100 inactive=60s;")
    c = client(srv.port)
    for _ in range(2):
        for name, text in files.items():
            status, h, body = c.send(req(f"/{name}")).response()
            assert (status, body) == (200, text.encode()), name
            assert h["content-length"] == str(len(text))
    c.send(b"".join(req(f"/{name}") for name in files for _ in range(2)))
    for name, text in files.items():
        for _ in range(2):
            status, _, body = c.response()
            assert (status, body) == (200, text.encode()), name
    status, h, body = c.send(req("/s3000.txt", "Connection: close")).response()
    assert (status, body, h["connection"]) == (200, files["s3000.txt"].encode(), "close")
    assert c.closed(within=2)
