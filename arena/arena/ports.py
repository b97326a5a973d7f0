"""Loopback port allocation: ask the kernel for a free port, and check a chosen one."""

from __future__ import annotations

import errno
import socket

from arena.errors import ArenaError

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (bind port 0, read it, release it), on UDP too:
    an HTTP/3 server (--h3) takes the same port number for QUIC.

    A race with another program is possible; the server start reports it as "port in use".
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((host, port))
                except OSError:
                    continue
                return port


def free_port_outside(client_ports: tuple[int, int], host: str = HOST) -> int:
    """A free port outside the kernel's client port range (`client_ports`, inclusive): no
    outgoing connection can take it, so a server killed on purpose can always be restarted
    on it. Above the range first, then below it; the usual free_port() if neither has room."""
    low, high = client_ports
    for port in [*range(high + 1, 65536), *range(low - 1, 1023, -1)]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    return free_port(host)


def check_free(port: int, host: str = HOST) -> None:
    """Raise a clear ArenaError if `port` cannot be bound on `host` as servers bind it: with
    SO_REUSEADDR, so connections of a stopped server still in TIME-WAIT do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ArenaError(f"port {host}:{port} is in use by another program") from None
            raise ArenaError(f"cannot bind {host}:{port}: {exc.strerror}") from None


def is_listening(port: int, host: str = HOST) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
