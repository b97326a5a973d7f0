"""One raw HTTP request to a running server: status, exact header bytes, body length.

Done per server before the load runs: it checks the server serves the right file, records the
response header each server sends (the studies noticed Apache sends more bytes per reply),
and gives the expected byte count per reply for each connection mode.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass


@dataclass
class Reply:
    status: int
    header_bytes: int
    body_bytes: int
    headers: str

    def to_dict(self) -> dict:
        return asdict(self)


def get(host: str, port: int, path: str, close: bool, extra_headers: str = "", timeout: float = 5.0) -> Reply:
    """GET `path` over a fresh connection and read the whole response (Content-Length framed)."""
    conn = "Connection: close\r\n" if close else ""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{conn}{extra_headers}\r\n".encode()
    with socket.create_connection((host, port), timeout=timeout) as sock:
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
        for line in headers.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while length is not None and len(body) < length:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            body += chunk
        if length is None:  # close-delimited body
            while chunk := sock.recv(1 << 20):
                body += chunk
    status = int(headers.split(" ", 2)[1])
    return Reply(status, len(head) + 4, len(body), headers)
