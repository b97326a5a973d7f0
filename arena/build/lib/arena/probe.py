"""One raw HTTP request to a running server: status, exact header bytes, body length.

Done per server before the load runs: it checks the server serves the right file, records the
response header each server sends (the studies noticed Apache sends more bytes per reply),
and gives the expected byte count per reply for each connection mode.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import asdict, dataclass

from arena import tls


@dataclass
class Reply:
    status: int
    header_bytes: int
    body_bytes: int                # the body itself (chunked bodies: decoded)
    headers: str
    wire_bytes: int = 0            # the whole response as sent: head, body and chunk framing

    def to_dict(self) -> dict:
        return asdict(self)


def _dechunk(sock: socket.socket, data: bytes) -> tuple[int, int]:
    """Read a chunked body whose first bytes are `data`: (decoded length, bytes on the wire)."""
    buf, size, wire = data, 0, 0

    def need(n: int) -> None:
        nonlocal buf
        while len(buf) < n:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise OSError("connection closed in the middle of a chunked body")
            buf += chunk

    while True:
        while b"\r\n" not in buf:
            need(len(buf) + 1)
        line, _, rest = buf.partition(b"\r\n")
        length = int(line.split(b";")[0], 16)
        wire += len(line) + 2
        buf = rest
        if length == 0:
            # Trailers (none expected) end with an empty line.
            while not buf.startswith(b"\r\n") and b"\r\n\r\n" not in buf:
                need(len(buf) + 1)
            end = 2 if buf.startswith(b"\r\n") else buf.index(b"\r\n\r\n") + 4
            return size, wire + end
        need(length + 2)
        size += length
        wire += length + 2
        buf = buf[length + 2:]


def _recv_to_close(sock: socket.socket) -> bytes:
    """What is left until the peer closes; over TLS a close without close_notify ends it too."""
    out = b""
    try:
        while chunk := sock.recv(1 << 20):
            out += chunk
    except ssl.SSLEOFError:
        pass
    return out


def get(host: str, port: int, path: str, close: bool, extra_headers: str = "", timeout: float = 5.0,
        context: ssl.SSLContext | None = None) -> Reply:
    """GET `path` over a fresh connection (TLS with `context`) and read the whole response
    (Content-Length framed, chunked, or up to the close)."""
    conn = "Connection: close\r\n" if close else ""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{conn}{extra_headers}\r\n".encode()
    with tls.connect(host, port, timeout, context) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise OSError("connection closed before the end of the response header")
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        headers = head.decode("latin-1")
        length = None
        chunked = False
        for line in headers.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if chunked:
            body_bytes, body_wire = _dechunk(sock, body)
        else:
            while length is not None and len(body) < length:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                body += chunk
            if length is None:  # close-delimited body
                body += _recv_to_close(sock)
            body_bytes = body_wire = len(body)
    status = int(headers.split(" ", 2)[1])
    return Reply(status, len(head) + 4, body_bytes, headers, len(head) + 4 + body_wire)
