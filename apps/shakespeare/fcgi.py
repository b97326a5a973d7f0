#!/usr/bin/env python3
"""A minimal FastCGI client (standard library only), to talk to PHP-FPM without a web server.

setup.sh uses it to check that each pool answers a real request for the app (PHP-FPM has no
health check of its own that proves PHP and MariaDB work end to end), and the tests use it to
reach both listeners directly.

    python3 fcgi.py unix:/run/php/shakespeare.sock /hamlet/1/1.json [--docroot DIR]
    python3 fcgi.py 127.0.0.1:9000 /

prints the status line, headers and body, and exits 0 for a 2xx answer, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys

FCGI_VERSION = 1
BEGIN_REQUEST, END_REQUEST, PARAMS, STDIN, STDOUT, STDERR = 1, 3, 4, 5, 6, 7
RESPONDER = 1
REQUEST_ID = 1

# Where setup.sh puts the app.
DEFAULT_DOCROOT = os.environ.get("SHAKESPEARE_DOCROOT", "/var/www/shakespeare")


class FastCGIError(Exception):
    pass


def _record(rtype: int, content: bytes) -> bytes:
    return struct.pack("!BBHHBB", FCGI_VERSION, rtype, REQUEST_ID, len(content), 0, 0) + content


def _length(n: int) -> bytes:
    # Name and value lengths: one byte below 128, else four bytes with the top bit set.
    return bytes([n]) if n < 128 else struct.pack("!I", n | 0x80000000)


def _params(params: dict[str, str]) -> bytes:
    out = bytearray()
    for name, value in params.items():
        n, v = name.encode(), value.encode()
        out += _length(len(n)) + _length(len(v)) + n + v
    return bytes(out)


def connect(address: str, timeout: float) -> socket.socket:
    """address: 'unix:/path', '/path' or 'host:port'."""
    if address.startswith("unix:") or address.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: object = address.removeprefix("unix:")
    else:
        host, _, port = address.rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        target = (host or "127.0.0.1", int(port))
    sock.settimeout(timeout)
    try:
        sock.connect(target)
    except OSError:
        sock.close()
        raise
    return sock


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise FastCGIError("connection closed in the middle of a record")
        buf += chunk
    return bytes(buf)


def request(
    address: str,
    uri: str,
    *,
    method: str = "GET",
    docroot: str = DEFAULT_DOCROOT,
    script: str = "/index.php",
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    """Send one request as a web server would after `try_files ... /index.php?$args`.

    Returns (status, headers with lower-case names, body). PHP's stderr output, if any,
    raises FastCGIError so that warnings do not pass unnoticed.
    """
    query = uri.partition("?")[2]
    params = {
        "GATEWAY_INTERFACE": "CGI/1.1",
        "SERVER_SOFTWARE": "fcgi.py",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "SERVER_NAME": "localhost",
        "SERVER_ADDR": "127.0.0.1",
        "SERVER_PORT": "80",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "40000",
        "REQUEST_METHOD": method,
        "REQUEST_URI": uri,
        "DOCUMENT_URI": script,
        "SCRIPT_NAME": script,
        "SCRIPT_FILENAME": docroot.rstrip("/") + script,
        "DOCUMENT_ROOT": docroot,
        "QUERY_STRING": query,
        "CONTENT_TYPE": "",
        "CONTENT_LENGTH": "",
        "HTTP_HOST": "localhost",
    }
    begin = struct.pack("!HB5x", RESPONDER, 0)
    payload = (
        _record(BEGIN_REQUEST, begin)
        + _record(PARAMS, _params(params))
        + _record(PARAMS, b"")
        + _record(STDIN, b"")
    )
    stdout, stderr = bytearray(), bytearray()
    with connect(address, timeout) as sock:
        sock.sendall(payload)
        while True:
            version, rtype, _rid, clen, plen, _ = struct.unpack("!BBHHBB", _read_exact(sock, 8))
            if version != FCGI_VERSION:
                raise FastCGIError(f"unexpected FastCGI version {version}")
            content = _read_exact(sock, clen)
            _read_exact(sock, plen)
            if rtype == STDOUT:
                stdout += content
            elif rtype == STDERR:
                stderr += content
            elif rtype == END_REQUEST:
                break
    if stderr:
        raise FastCGIError("PHP wrote to stderr: " + stderr.decode(errors="replace").strip())
    head, sep, body = bytes(stdout).partition(b"\r\n\r\n")
    if not sep:
        raise FastCGIError(f"no CGI header block in the answer: {bytes(stdout[:200])!r}")
    headers: dict[str, str] = {}
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(headers.pop("status", "200").split()[0])
    return status, headers, body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("address", help="unix:/path/to.sock or host:port")
    ap.add_argument("uri", nargs="?", default="/")
    ap.add_argument("--docroot", default=DEFAULT_DOCROOT)
    ap.add_argument("--method", default="GET")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("-q", "--quiet", action="store_true", help="print nothing, only set the exit code")
    args = ap.parse_args()
    try:
        status, headers, body = request(
            args.address, args.uri, method=args.method, docroot=args.docroot, timeout=args.timeout
        )
    except (OSError, FastCGIError) as e:
        if not args.quiet:
            print(f"{args.address}: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(status)
        for name, value in headers.items():
            print(f"{name}: {value}")
        print()
        sys.stdout.write(body.decode("utf-8", errors="replace"))
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
