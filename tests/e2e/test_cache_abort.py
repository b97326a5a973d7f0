"""A client that leaves while its cache miss is being fetched: as nginx (whose upstream goes
on when the answer is cacheable), the rest of the answer is still read and the entry
stored, and a request waiting on `proxy_cache_lock` gets it. The application sends the
head and the first part of a big body, then waits until the test lets it go on; the first
client reads a few bytes and closes. The next request must be a HIT with the whole body,
on gannet and on nginx alike, and the application must have been asked once."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

import rawapps
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

SIZE = 3 * 1024 * 1024
FIRST = 64 * 1024
BODY = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(SIZE // 32))

CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_set_header X-Who $server_port;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 30s;
        }
    }
}
"""


class SlowApp(rawapps.Listener):
    """Answers each request with BODY: the first FIRST bytes at once, the rest once the
    test sets `go[who]` (a second request of a `who` gets it all at once)."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.go: dict = {}
        self.sent: dict = {}
        self.mu = threading.Lock()
        super().__init__()

    def events(self, who: str) -> tuple[threading.Event, threading.Event]:
        with self.mu:
            return self.go.setdefault(who, threading.Event()), self.sent.setdefault(who, threading.Event())

    def serve(self, conn):
        head = b""
        while b"\r\n\r\n" not in head:
            got = conn.recv(4096)
            if not got:
                return
            head += got
        who = ""
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"x-who:"):
                who = line.split(b":", 1)[1].strip().decode()
        with self.mu:
            self.counts[who] += 1
            first = self.counts[who] == 1
        go, sent = self.events(who)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     + f"Content-Length: {SIZE}\r\nConnection: close\r\n\r\n".encode() + BODY[:FIRST])
        if first:
            go.wait(30)
        conn.sendall(BODY[FIRST:])
        if first:
            sent.set()


@pytest.fixture
def app():
    yield from rawapps.made(SlowApp)


def leave_early(port: int) -> bytes:
    """Ask for /big, read the first bytes of the answer, and close."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got or len(got) < 4096:
        more = s.recv(4096)
        if not more:
            break
        got += more
    s.close()
    return got


def ask(port: int):
    a = exchange(port, b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", timeout=30)
    return a.status, a.headers.get("x-cache", ""), hashlib.md5(a.body).hexdigest(), len(a.body)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_entry_stored_after_the_client_left_mid_miss(tmp_path, app):
    up = app()
    conf = CONF.replace("@UP@", str(up.port))
    results = {}
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            who = str(port)
            go, sent = up.events(who)
            first = leave_early(port)
            assert first.startswith(b"HTTP/1.1 200"), first[:100]
            assert b"x-cache: miss" in first.lower()
            # The next request comes while the answer is still being fetched: it waits on
            # the lock (or finds the entry), and must be answered from the entry.
            with ThreadPoolExecutor(1) as pool:
                second = pool.submit(ask, port)
                go.set()
                assert sent.wait(30)
                results[name] = second.result()
            assert up.counts[who] == 1, (name, up.counts)
            # A later request finds the entry too.
            assert ask(port) == results[name]
    want = (200, "HIT", hashlib.md5(BODY).hexdigest(), SIZE)
    assert results == {"nginx": want, "gannet": want}
