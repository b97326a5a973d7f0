"""memcached_pass against a real memcached (Debian's package, started per test on its own
port as nobody), filled with raw `set` commands, and compared with Debian's nginx on the
same config: hits, misses with an `error_page 404 = @app` fall-back, the gzip flag, key
escaping, ranges, a dead server (502) and the next server of a group."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading

import pytest

from conftest import free_port, wait_port, wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

MEMCACHED = shutil.which("memcached") or "/usr/bin/memcached"

pytestmark = pytest.mark.skipif(
    not shutil.which("memcached") and not shutil.which("/usr/bin/memcached"),
    reason="memcached is installed by scripts/test-all.sh",
)


class Memcached:
    """A memcached of our own on a free port (or a unix socket), stopped at the end of the
    test."""

    def __init__(self, unix: str | None = None):
        self.port, self.unix = free_port(), unix
        where = ["-s", unix, "-a", "0666"] if unix else ["-l", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            [MEMCACHED, "-u", "nobody", "-U", "0", *where],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if unix:
            assert wait_until(lambda: os.path.exists(unix) or self.proc.poll() is not None)
        else:
            wait_port(self.port, self.proc)

    def connect(self) -> socket.socket:
        if self.unix:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(self.unix)
            return s
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def set(self, key: bytes, value: bytes, flags: int = 0) -> None:
        with self.connect() as s:
            s.sendall(b"set %s %d 0 %d\r\n%s\r\n" % (key, flags, len(value), value))
            got = b""
            while not got.endswith(b"\r\n"):
                got += s.recv(100)
            assert got == b"STORED\r\n", got

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def memcached():
    m = Memcached()
    yield m
    m.stop()


def dead_port() -> int:
    """A port nothing listens on."""
    return free_port()


CONF = PEER_MAIN + """
http {
    types { text/html html; image/png png; }
    default_type application/octet-stream;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location / {
            set $memcached_key "$uri$is_args$args";
            memcached_pass 127.0.0.1:MC;
            error_page 404 = @app;
        }
        location /gz/ {
            set $memcached_key $uri;
            memcached_gzip_flag 2;
            memcached_pass 127.0.0.1:MC;
        }
        location /plain404/ {
            set $memcached_key $uri;
            memcached_pass 127.0.0.1:MC;
        }
        location /dead/ {
            set $memcached_key $uri;
            memcached_pass 127.0.0.1:DEAD;
        }
        location /nokey/ {
            set $memcached_key "";
            memcached_pass 127.0.0.1:MC;
        }
        location @app {
            return 200 "fallback $uri\\n";
        }
    }
}
"""


def fill(m: Memcached) -> None:
    m.set(b"/a.html", b"<p>hit</p>\n")
    m.set(b"/img.png", bytes(range(256)) * 3)
    m.set(b"/q?x=1", b"with args\n")
    # `$uri` is decoded: a space goes out as %20, a % as %25, as nginx's NGX_ESCAPE_MEMCACHED.
    m.set(b"/sp%20ace%25", b"escaped\n")
    m.set(b"/gz/z", b"\x1f\x8bnot really gzip", flags=2)
    m.set(b"/gz/p", b"plain", flags=1)
    m.set(b"/empty", b"")


REQUESTS = [
    b"GET /a.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /img.png HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /q?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /sp%20ace%25 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /missing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /empty HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /gz/z HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /gz/p HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /plain404/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"HEAD /a.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /img.png HTTP/1.1\r\nHost: x\r\nRange: bytes=10-19\r\nConnection: close\r\n\r\n",
    b"POST /a.html HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab",
    b"GET /dead/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /nokey/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
]

COMPARED = ("content-type", "content-length", "content-encoding", "content-range", "accept-ranges")


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_memcached_as_nginx(tmp_path, memcached):
    fill(memcached)
    conf = CONF.replace("MC", str(memcached.port)).replace("DEAD", str(dead_port()))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        statuses = []
        for req in REQUESTS:
            ours, theirs = exchange(srv.port, req), exchange(nginx_port, req)
            line = req.split(b"\r\n")[0]
            assert ours.status == theirs.status, line
            statuses.append(ours.status)
            for h in COMPARED:
                assert ours.headers.get(h) == theirs.headers.get(h), (line, h)
            if ours.status in (200, 206):
                assert ours.body == theirs.body, line
        assert statuses == [200, 200, 200, 200, 200, 200, 200, 200, 404, 200, 206, 405, 502, 500]
        assert exchange(srv.port, REQUESTS[4]).body == b"fallback /missing\n"
        assert exchange(srv.port, REQUESTS[6]).headers["content-encoding"] == "gzip"
        log = srv.error_log()
        assert 'the "$memcached_key" variable is not set' in log
        assert "connect() failed (" in log and "while connecting to upstream" in log
        assert 'upstream: "memcached://127.0.0.1:' in log


def test_next_upstream(gannet, memcached):
    """A group with a dead server first: the next one answers (`error`); with
    `memcached_next_upstream not_found` a miss goes on to the next server too."""
    other = Memcached()
    try:
        memcached.set(b"/k", b"from one\n")
        other.set(b"/only-two", b"from two\n")
        srv = gannet.start(
            http=f"""
            upstream dead_first {{ server 127.0.0.1:{dead_port()}; server 127.0.0.1:{memcached.port}; }}
            upstream dead_off {{ server 127.0.0.1:{dead_port()} max_fails=0;
                                 server 127.0.0.1:{memcached.port} max_fails=0; }}
            upstream pair {{ server 127.0.0.1:{memcached.port}; server 127.0.0.1:{other.port}; }}
            """,
            server="""
            location /k { set $memcached_key $uri; memcached_pass dead_first; }
            location /only-two { set $memcached_key $uri; memcached_pass pair;
                                 memcached_next_upstream not_found; }
            location /off { set $memcached_key /k; memcached_pass dead_off;
                            memcached_next_upstream off; }
            """,
        )
        for _ in range(2):
            assert srv.get("/k")[0::2] == (200, b"from one\n")
            assert srv.get("/only-two")[0::2] == (200, b"from two\n")
        # With retries off, the round-robin reaches the dead server on one of two tries.
        assert 502 in {srv.get("/off")[0] for _ in range(4)}
    finally:
        other.stop()


def fake_memcached(answer: bytes, hold: threading.Event | None = None) -> tuple[int, threading.Thread]:
    """A server that reads one request line and sends `answer` back, then closes (once
    `hold` is set, if given)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)

    def serve():
        with ls:
            c, _ = ls.accept()
            with c:
                got = b""
                while not got.endswith(b"\r\n"):
                    got += c.recv(1000)
                c.sendall(answer)
                if hold:
                    hold.wait(10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return ls.getsockname()[1], t


@pytest.mark.parametrize(
    "answer,logged",
    [
        (b"SERVER_ERROR out of memory\r\n", 'memcached sent invalid response: "SERVER_ERROR out of memory"'),
        (b"VALUE /other 0 2\r\nab\r\nEND\r\n", 'memcached sent invalid key in response "VALUE /other 0 2" for key "/x"'),
        (b"VALUE /x 0 zz\r\n", 'memcached sent invalid length in response "VALUE /x 0 zz" for key "/x"'),
    ],
)
def test_bad_answers_are_502(gannet, answer, logged):
    port, t = fake_memcached(answer)
    srv = gannet.start(server=f"location / {{ set $memcached_key $uri; memcached_pass 127.0.0.1:{port}; }}")
    assert srv.get("/x")[0] == 502
    t.join(5)
    assert wait_until(lambda: logged in srv.error_log())


def test_bad_trailer_is_logged(gannet):
    """The value goes out with its announced length; a wrong trailer is only logged."""
    port, t = fake_memcached(b"VALUE /x 0 3\r\nabcXXXXXXX")
    srv = gannet.start(server=f"location / {{ set $memcached_key $uri; memcached_pass 127.0.0.1:{port}; }}")
    assert srv.get("/x")[0::2] == (200, b"abc")
    t.join(5)
    assert wait_until(lambda: "memcached sent invalid trailer" in srv.error_log())


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_config_errors_as_nginx(tmp_path):
    n, g = check_both(tmp_path, "server { listen 127.0.0.1:2; location / { memcached_pass 127.0.0.1:1; } }")
    assert n.returncode != 0 and g.returncode != 0
    assert 'unknown "memcached_key" variable' in n.stderr and 'unknown "memcached_key" variable' in g.stderr
    n, g = check_both(
        tmp_path,
        "server { listen 127.0.0.1:2; location / { set $memcached_key $uri; memcached_pass 127.0.0.1:1; memcached_next_upstream http_500; } }",
    )
    assert n.returncode != 0 and g.returncode != 0
    assert 'invalid value "http_500"' in n.stderr and 'invalid value "http_500"' in g.stderr
    assert "check.conf:" in g.stderr
    n, g = check_both(tmp_path, "memcached_pass 127.0.0.1:1;")
    assert n.returncode != 0 and g.returncode != 0
    assert '"memcached_pass" directive is not allowed here' in n.stderr
    assert '"memcached_pass" directive is not allowed here' in g.stderr


def total_connections(m: Memcached) -> int:
    with m.connect() as s:
        s.sendall(b"stats\r\n")
        got = b""
        while not got.endswith(b"END\r\n"):
            got += s.recv(65536)
    # Counts the `stats` connection itself too.
    return int(got.split(b"STAT total_connections ")[1].split(b"\r\n")[0])


def test_keepalive_reuses_connections(gannet, memcached):
    """With the group's `keepalive`, a value read to its END keeps its connection."""
    memcached.set(b"/k", b"v")
    srv = gannet.start(
        http=f"upstream kept {{ server 127.0.0.1:{memcached.port}; keepalive 2; }}",
        server="""
        location /kept { set $memcached_key /k; memcached_pass kept; }
        location /miss { set $memcached_key /none; memcached_pass kept; error_page 404 = /kept; }
        """,
    )
    before = total_connections(memcached)
    for path in ["/kept", "/miss", "/kept", "/miss", "/kept"]:
        assert srv.get(path)[0::2] == (200, b"v")
    # One connection for all eight gets (and one for this `stats`).
    assert total_connections(memcached) - before == 2


def test_read_timeout_is_504(gannet):
    hold = threading.Event()
    port, t = fake_memcached(b"", hold)
    try:
        srv = gannet.start(
            server=f"location / {{ set $memcached_key $uri; memcached_read_timeout 200ms; memcached_pass 127.0.0.1:{port}; }}"
        )
        assert srv.get("/x")[0] == 504
        assert wait_until(lambda: "upstream timed out" in srv.error_log() and "while reading response header from upstream" in srv.error_log())
    finally:
        hold.set()
        t.join(5)


def test_unix_socket(gannet):
    d = tempfile.mkdtemp(prefix="gannet-mc-")
    os.chmod(d, 0o777)
    m = Memcached(unix=f"{d}/m.sock")
    try:
        m.set(b"/u", b"over unix\n")
        srv = gannet.start(server=f"location / {{ set $memcached_key $uri; memcached_pass unix:{d}/m.sock; }}")
        assert srv.get("/u")[0::2] == (200, b"over unix\n")
    finally:
        m.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_head_closes_kept_connection_as_nginx(tmp_path, memcached):
    """A HEAD request's value is not read: its connection is closed, not kept, as nginx does
    (the next request opens a new one); a GET's is kept."""
    memcached.set(b"/k", b"v" * 1000)
    conf = PEER_MAIN + f"""
http {{
    upstream kept {{ server 127.0.0.1:{memcached.port}; keepalive 2; }}
    server {{
        listen 127.0.0.1:{{port}};
        location / {{ set $memcached_key /k; memcached_pass kept; }}
    }}
}}
"""
    def opened(port, method):
        before = total_connections(memcached)
        assert exchange(port, b"%s / HTTP/1.0\r\nHost: x\r\n\r\n" % method).status == 200
        assert exchange(port, b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").status == 200
        # Minus the `stats` connection.
        return total_connections(memcached) - before - 1

    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            # Warm: one connection kept.
            exchange(port, b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        got = {m: opened(srv.port, m) for m in (b"GET", b"HEAD")}
        want = {m: opened(nginx_port, m) for m in (b"GET", b"HEAD")}
    assert got == want == {b"GET": 0, b"HEAD": 1}
