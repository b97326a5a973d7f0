"""HTTP/2 request fields as nginx takes them, on gannet and Debian's nginx with one config:
Huffman-coded strings padded with a whole byte of ones (RFC 7541 calls it an error; nginx,
and so gannet, reads them as meant), and field names and values nginx answers 400 (a
space, a colon or a control character in a name; CR or LF in a value), which the h2 crate
alone would have ended the connection for (GOAWAY, no answer).
"""

from __future__ import annotations

import socket
import struct

import pytest

from conftest import log_lines
from nginx_peer import NGINX, PEER_MAIN, side_by_side

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, GOAWAY = 1, 3, 7

CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        location / { add_header X-Got "$http_x_a|$http_x_b"; return 200; }
    }
}
"""

# "aaaaaaaa": eight 5-bit codes (00011) end on a byte boundary; a whole byte of ones after.
AAAAAAAA_PADDED = bytes([0x18, 0xC6, 0x31, 0x8C, 0x63, 0xFF])


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes, huffman_value: bool = False) -> bytes:
    """A field without indexing, with a new name (plain) and its value."""
    return b"\x00" + bytes([len(name)]) + name + bytes([(0x80 if huffman_value else 0) | len(value)]) + value


def status_of(port: int, fields: bytes, authority: bytes = b"\x01\x09localhost",
              pseudo: bytes = b"\x82\x86\x84") -> str:
    """GET / with `fields` after the pseudo-headers: the answer's status ("200", "400"), or
    "GOAWAY" when the connection was ended instead, or "none"."""
    block = pseudo + authority + fields  # GET, http, /, :authority localhost
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(PREFACE + frame(4, 0, 0, b"") + frame(HEADERS, 0x5, 1, block))
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
                while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                    n = int.from_bytes(data[:3], "big")
                    kind, sid, payload = data[3], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9:9 + n]
                    data = data[9 + n:]
                    if kind == GOAWAY:
                        return "GOAWAY"
                    if kind == RST_STREAM and sid == 1:
                        return "RST_STREAM"
                    if kind == HEADERS and sid == 1:
                        # :status from the static table (nginx and the h2 crate both index it).
                        return {0x88: "200", 0x8C: "400"}.get(payload[0], f"other {payload[:4]!r}")
        except (socket.timeout, ConnectionResetError):
            pass
    return "none"


CASES = {
    "padded huffman": literal(b"x-a", AAAAAAAA_PADDED, huffman_value=True),
    "empty huffman": literal(b"x-b", b"\xff", huffman_value=True),
    "space in name": literal(b"x foo", b"bar"),
    "colon in name": literal(b"x:foo", b"bar"),
    "control in name": literal(b"foo\x02", b"bar"),
    "newline in value": literal(b"x-a", b"x\r\nreferer: y"),
    "lawful": literal(b"x-a", b"bar"),
}


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_request_fields_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = {k: status_of(srv.port, f) for k, f in CASES.items()}
        want = {k: status_of(nginx_port, f) for k, f in CASES.items()}
    taken = ["padded huffman", "empty huffman", "lawful"]
    assert {k: got[k] for k in taken} == {k: want[k] for k in taken} == {k: "200" for k in taken}
    # The fields nginx refuses: 400 as nginx answers since 1.25 (nginx-tests' h2_headers.t);
    # Debian's 1.22 resets the stream or ends the connection. Neither serves the request.
    refused = [k for k in CASES if k not in taken]
    assert {k: got[k] for k in refused} == {k: "400" for k in refused}
    assert not any(want[k] == "200" for k in refused), want


AUTHORITIES = {
    "empty authority": (b"\x41\x00", b""),
    "separators in authority": (b"\x41\x0c\x1b/xample.com", b""),
    "control in host": (b"", b"\x66\x0alocalhost\x02"),
    "lawful authority": (b"\x41\x09localhost", b""),
    "lawful host": (b"", b"\x66\x09localhost"),
}


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_authority_nginx_refuses(tmp_path):
    """An :authority the h2 crate takes for none (empty, with a path separator) or a Host with
    a control character: 400, as nginx answers since 1.25 (nginx-tests' h2_host.t), where
    the codec alone would reset the stream."""
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = {k: status_of(srv.port, f, a) for k, (a, f) in AUTHORITIES.items()}
        want = {k: status_of(nginx_port, f, a) for k, (a, f) in AUTHORITIES.items()}
    taken = ["lawful authority", "lawful host"]
    assert {k: got[k] for k in taken} == {k: want[k] for k in taken} == {k: "200" for k in taken}
    refused = [k for k in AUTHORITIES if k not in taken]
    assert {k: got[k] for k in refused} == {k: "400" for k in refused}
    assert not any(want[k] == "200" for k in refused), want


CLOSE_CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        error_page 400 = /close;
        location / { return 200; }
        location /close { return 444; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_refused_request_goes_through_error_page(tmp_path):
    """A request HTTP/2 refuses (no :scheme) is finalized with 400 through the server's
    error_page, as nginx's (ticket #274): `return 444` there resets the stream."""
    with side_by_side(tmp_path, CLOSE_CONF) as (srv, nginx_port):
        got = [status_of(srv.port, b""), status_of(srv.port, b"", pseudo=b"\x82\x84")]
        want = [status_of(nginx_port, b""), status_of(nginx_port, b"", pseudo=b"\x82\x84")]
    assert got == want == ["200", "RST_STREAM"]


LENGTH_CONF = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port} http2;
        location / { return 200 "$request_length"; }
    }
}
"""


def body_of(port: int, block: bytes) -> bytes:
    """The DATA of the answer to a request with header block `block` on stream 1."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(PREFACE + frame(4, 0, 0, b"") + frame(HEADERS, 0x5, 1, block))
        data, body = b"", b""
        while chunk := s.recv(65536):
            data += chunk
            while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                n = int.from_bytes(data[:3], "big")
                kind, flags, payload = data[3], data[4], data[9:9 + n]
                data = data[9 + n:]
                if kind == 0:
                    body += payload
                    if flags & 1:
                        return body
    return body


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_request_length_is_the_header_block(tmp_path):
    """$request_length over HTTP/2 is the header block's length as it came (HPACK-coded)."""
    blocks = [b"\x82\x86\x84\x01\x09localhost",
              b"\x82\x86\x84\x01\x09localhost" + literal(b"x-long", b"v" * 100)]
    with side_by_side(tmp_path, LENGTH_CONF) as (srv, nginx_port):
        got = [body_of(srv.port, b) for b in blocks]
        want = [body_of(nginx_port, b) for b in blocks]
    assert got == want == [str(len(b)).encode() for b in blocks]


CONNECT_CONF = PEER_MAIN + r"""
http {
    log_format s "$request_method $status \"$request\"";
    access_log {tmp}/access.log s;
    server {
        listen 127.0.0.1:{port} http2;
        location / { return 200; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_connect_is_405_as_nginx(tmp_path):
    """CONNECT with :scheme and :path, which the h2 crate alone resets: answered 405 and
    logged as CONNECT, as nginx answers it; the method's name from the static table (the
    field indexed into the dynamic one) or a literal name."""
    tail = b"\x86\x84\x01\x09localhost"
    blocks = [b"\x42\x07CONNECT" + tail, b"\x00\x07:method\x07CONNECT" + tail]
    with side_by_side(tmp_path, CONNECT_CONF) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            for block in blocks:
                # Answered (its :status is not in the static table: the log says which).
                assert status_of(port, b"", authority=b"", pseudo=block).startswith("other"), port
        got = log_lines(tmp_path / "gannet" / "access.log", 2)
        want = log_lines(tmp_path / "nginx" / "access.log", 2)
    assert got == want == ['CONNECT 405 "CONNECT / HTTP/2.0"'] * 2
