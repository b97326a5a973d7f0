"""Balancing methods of `upstream` groups over real sockets: gannet with `fastcgi_pass` to a
group of raw FastCGI applications that each answer with their own index, so a test sees which
server took each request.

`least_conn` is checked against a server held busy, `ip_hash` with clients bound to different
loopback addresses (all of 127.0.0.0/8 is the loopback), `hash` per key and `consistent` by
removing a server, `random` by its spread and weights; down and dead servers are skipped by
all. Then the same group in Debian's nginx and in gannet must map the same keys and clients
to the same servers: the evidence that the arithmetic is nginx's.
"""

from __future__ import annotations

import re
import socket
import struct
import threading

import pytest

from conftest import free_port, wait_until
from nginx_peer import NGINX, PEER_MAIN, NginxPeer, parse
from rawapps import Listener, end_request, record


CONF = PEER_MAIN + r"""
http {
    access_log off;
    upstream apps {
        %(upstream)s
    }
    server {
        listen 127.0.0.1:{port};
        location / {
            fastcgi_param REQUEST_URI $request_uri;
            fastcgi_pass apps;
        }
    }
}
"""


class Hold:
    """Shared by a set of apps: requests for /hold wait for `release`; `arrived` says one did."""

    def __init__(self):
        self.arrived = threading.Event()
        self.release = threading.Event()


class IdApp(Listener):
    """A FastCGI application that answers every request with its index (the body) and keeps
    the request URIs it served in `hits`."""

    def __init__(self, index: int, hold: Hold):
        self.index, self.hold, self.hits = index, hold, []
        super().__init__()

    def serve(self, conn):
        with conn, conn.makefile("rb") as f:
            params = read_params(f)
            if params is None:
                return
            uri = params.get(b"REQUEST_URI", b"").decode()
            self.hits.append(uri)
            if uri.startswith("/hold"):
                self.hold.arrived.set()
                self.hold.release.wait(10)
            body = b"Content-Type: text/plain\r\n\r\n%d" % self.index
            conn.sendall(record(6, body) + end_request())


def read_params(f) -> dict | None:
    """A request's PARAMS, read up to its empty STDIN record; None if the connection ends."""
    raw = b""
    while True:
        head = f.read(8)
        if len(head) < 8:
            return None
        _, kind, _, length, padding = struct.unpack(">BBHHB", head[:7])
        content = f.read(length + padding)[:length]
        if kind == 4:
            raw += content
        elif kind == 5 and length == 0:
            return decode_pairs(raw)


def decode_pairs(raw: bytes) -> dict:
    def length(i):
        if raw[i] < 128:
            return raw[i], i + 1
        return struct.unpack(">I", raw[i:i + 4])[0] & 0x7FFFFFFF, i + 4

    out, i = {}, 0
    while i < len(raw):
        n, i = length(i)
        v, i = length(i)
        out[raw[i:i + n]] = raw[i + n:i + n + v]
        i += n + v
    return out


@pytest.fixture
def apps():
    """`apps(n)`: n apps (indices 0..n-1) sharing one Hold; all closed at the end."""
    made, hold = [], Hold()

    def make(n):
        new = [IdApp(len(made) + i, hold) for i in range(n)]
        made.extend(new)
        return new

    make.hold = hold
    yield make
    hold.release.set()
    for a in made:
        a.close()


def upstream(method: str, apps, extra=None) -> str:
    """The body of `upstream apps {}`: the method, then a server line per app with `extra[i]`."""
    extra = extra or {}
    lines = [f"server 127.0.0.1:{a.port} {extra.get(i, '')};" for i, a in enumerate(apps)]
    return "\n        ".join([method] + lines)


def start(gannet, method, apps, extra=None):
    return gannet.start(conf=CONF % {"upstream": upstream(method, apps, extra)})


def ask(port: int, path: str, source: str = "127.0.0.1") -> int:
    """GET `path` from the client address `source`; the index of the app that answered."""
    with socket.socket() as s:
        s.settimeout(10)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    a = parse(raw)
    assert a.status == 200, raw
    return int(a.body)


KEYS = [f"k{i}" for i in range(40)] + ["user-42", "a%20b", "x" * 300, "Z", "0", "1", "key=1", "%00", "~"]
# An empty key is no key: nginx goes round robin, and so must gannet (checked against nginx).
WITH_EMPTY = KEYS[:20] + [""] + KEYS[20:]
# Client addresses in different /24s, and pairs in one /24 (ip_hash reads three octets).
SOURCES = [f"127.{i % 7 + 1}.{i}.1" for i in range(40)] + [f"127.9.9.{i}" for i in (1, 2, 200)] + ["127.3.3.3", "127.3.3.250"]


def by_key(port, keys=KEYS):
    return [ask(port, f"/id?k={k}") for k in keys]


def by_source(port, sources=SOURCES):
    return [ask(port, "/id", source=s) for s in sources]


# --- least_conn -------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["least_conn;", ""])
def test_least_conn_sends_to_the_idle_server(gannet, apps, method):
    """One of two servers holds a request: least_conn sends every other request to the idle
    one; round robin (the control) still sends half of them to the busy one."""
    a = apps(2)
    srv = start(gannet, method, a)
    hold = apps.hold
    held = threading.Thread(target=ask, args=(srv.port, "/hold"))
    held.start()
    try:
        assert hold.arrived.wait(10), "the held request never reached an app"
        busy = next(x.index for x in a if "/hold" in x.hits)
        got = [ask(srv.port, f"/id?n={n}") for n in range(6)]
    finally:
        hold.release.set()
        held.join(10)
    if method:
        assert got == [1 - busy] * 6, got
    else:
        assert got.count(busy) == 3, got


def test_least_conn_uses_all_when_idle(gannet, apps):
    a = apps(3)
    srv = start(gannet, "least_conn;", a)
    got = [ask(srv.port, "/id") for _ in range(9)]
    assert sorted(got) == [0, 0, 0, 1, 1, 1, 2, 2, 2], "idle servers tie: round robin among them"


# --- ip_hash ----------------------------------------------------------------------------

def test_ip_hash_is_stable_per_client_network(gannet, apps):
    a = apps(4)
    srv = start(gannet, "ip_hash;", a)
    first = by_source(srv.port)
    assert by_source(srv.port) == first, "a client keeps its server"
    where = dict(zip(SOURCES, first))
    assert where["127.9.9.1"] == where["127.9.9.2"] == where["127.9.9.200"]
    assert where["127.3.3.3"] == where["127.3.3.250"]
    assert set(first) == {0, 1, 2, 3}, f"every server has some clients: {first}"


def test_ip_hash_down_keeps_the_other_clients_in_place(gannet, apps):
    a = apps(4)
    up = start(gannet, "ip_hash;", a)
    before = by_source(up.port)
    down = start(gannet, "ip_hash;", a, {2: "down"})
    after = by_source(down.port)
    for b, c in zip(before, after):
        assert c == b or (b == 2 and c != 2), (before, after)
    assert 2 in before and 2 not in after


# --- hash -------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["hash $arg_k;", "hash $arg_k consistent;"])
def test_hash_is_stable_per_key(gannet, apps, method):
    a = apps(4)
    srv = start(gannet, method, a)
    first = by_key(srv.port)
    assert by_key(srv.port) == first
    assert set(first) == {0, 1, 2, 3}, first


def test_hash_key_with_several_variables(gannet, apps):
    """The key is a template: `$arg_a$http_x_user` changes with either part."""
    a = apps(4)
    srv = gannet.start(conf=(CONF % {"upstream": upstream("hash $arg_a$http_x_user;", a)}))

    def ask_user(arg, user):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(f"GET /id?a={arg} HTTP/1.1\r\nHost: t\r\nX-User: {user}\r\nConnection: close\r\n\r\n".encode())
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
        return int(parse(raw).body)

    # "ab" + "" and "a" + "b" are the same key, so the same server.
    for i in range(20):
        assert ask_user(f"u{i}b", "") == ask_user(f"u{i}", "b")
    assert len({ask_user("", f"user{i}") for i in range(20)}) > 1, "the header takes part"


@pytest.mark.parametrize("method,most", [("hash $arg_k consistent;", 0.45), ("hash $arg_k;", 1.0)])
def test_removing_a_server(gannet, apps, method, most):
    """With `consistent`, removing one of four servers moves only that server's keys (about a
    quarter); plain `hash` (the control) moves many more."""
    a = apps(4)
    keys = [f"item{i}" for i in range(200)]
    four = by_key(start(gannet, method, a).port, keys)
    three = by_key(start(gannet, method, a[:3]).port, keys)
    moved = [(b, c) for b, c in zip(four, three) if b != c]
    if "consistent" in method:
        assert all(b == 3 for b, _ in moved), "only the removed server's keys move"
        assert 0.1 * len(keys) <= len(moved) <= most * len(keys), len(moved)
    else:
        assert len(moved) > 0.5 * len(keys), len(moved)


def test_dead_server_is_skipped_like_a_down_one(gannet, apps):
    """A server nobody listens on fails once, then its keys go where a `down` server's go;
    every request is answered."""
    a = apps(3)
    dead = free_port()
    body = "\n        ".join(
        ["hash $arg_k;"]
        + [f"server 127.0.0.1:{x.port};" for x in a[:2]]
        + [f"server 127.0.0.1:{dead} max_fails=1 fail_timeout=30s;", f"server 127.0.0.1:{a[2].port};"]
    )
    srv = gannet.start(conf=CONF % {"upstream": body})
    got = by_key(srv.port)
    log = srv.error_log()
    assert log.count("connect() failed") == 1, log
    as_down = gannet.start(conf=CONF % {"upstream": body.replace("max_fails=1 fail_timeout=30s", "down")})
    assert by_key(as_down.port) == got


# --- random -----------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["random;", "random two;", "random two least_conn;"])
def test_random_spreads_over_all(gannet, apps, method):
    a = apps(4)
    srv = start(gannet, method, a)
    got = [ask(srv.port, "/id") for _ in range(100)]
    assert set(got) == {0, 1, 2, 3}, got


def test_random_honours_weights(gannet, apps):
    a = apps(2)
    srv = start(gannet, "random;", a, {0: "weight=3"})
    got = [ask(srv.port, "/id") for _ in range(300)]
    # Expected 225 of 300 (deviation 7.5): a wide margin, never met by equal weights.
    assert 190 <= got.count(0) <= 260, got.count(0)


def test_random_two_avoids_the_busy_server(gannet, apps):
    """Of two servers, `random two` always draws both and takes the less loaded."""
    a = apps(2)
    srv = start(gannet, "random two;", a)
    hold = apps.hold
    held = threading.Thread(target=ask, args=(srv.port, "/hold"))
    held.start()
    try:
        assert hold.arrived.wait(10)
        busy = next(x.index for x in a if "/hold" in x.hits)
        got = [ask(srv.port, "/id") for _ in range(10)]
    finally:
        hold.release.set()
        held.join(10)
    assert got == [1 - busy] * 10, got


# --- every method ------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["least_conn;", "ip_hash;", "hash $arg_k;", "hash $arg_k consistent;", "random;", "random two;"])
def test_down_server_gets_nothing(gannet, apps, method):
    a = apps(3)
    srv = start(gannet, method, a, {1: "down"})
    got = by_key(srv.port, KEYS[:20]) + by_source(srv.port, SOURCES[:20])
    assert 1 not in got and set(got) == {0, 2}, got
    assert a[1].hits == []


CONFIG_ERRORS = {
    "ip_hash; least_conn;": "load balancing method redefined",
    "hash;": 'invalid number of arguments in "hash" directive',
    "hash $uri sometimes;": 'invalid parameter "sometimes"',
    "random three;": 'invalid parameter "three"',
    "random two most_conn;": 'invalid parameter "most_conn"',
    "ip_hash on;": 'invalid number of arguments in "ip_hash" directive',
    "hash $no_such_variable;": 'unknown "no_such_variable" variable',
}


@pytest.mark.parametrize("stmt", list(CONFIG_ERRORS))
def test_config_errors(gannet, stmt):
    r = gannet.check(http=f"upstream u {{\n{stmt}\nserver 127.0.0.1:9;\n}}")
    assert r.returncode != 0
    assert CONFIG_ERRORS[stmt] in r.stderr, r.stderr
    if "variable" not in stmt:
        assert re.search(r"check\.conf:\d+", r.stderr), r.stderr


@pytest.mark.parametrize("method", ["ip_hash;", "hash $uri;", "random;"])
def test_backup_is_refused_by_hashing_and_random(gannet, method):
    r = gannet.check(http=f"upstream u {{\n{method}\nserver 127.0.0.1:9;\nserver 127.0.0.1:10 backup;\n}}")
    assert r.returncode != 0
    assert 'balancing method does not support parameter "backup"' in r.stderr, r.stderr
    ok = gannet.check(http="upstream u {\nleast_conn;\nserver 127.0.0.1:9;\nserver 127.0.0.1:10 backup;\n}")
    assert ok.returncode == 0, ok.stderr


# --- slow_start --------------------------------------------------------------------------

class LateApp(IdApp):
    """An IdApp whose port is bound but refuses connections until `open()`."""

    def __init__(self, index: int, hold: Hold):
        self.index, self.hold, self.hits, self.conns = index, hold, [], []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def open(self):
        self.sock.listen(16)
        threading.Thread(target=self.loop, daemon=True).start()


SLOW_CONF = PEER_MAIN + r"""
http {
    access_log off;
    upstream ramp {
        server 127.0.0.1:%(a)d;
        server 127.0.0.1:%(b)d max_fails=1 fail_timeout=1s slow_start=10m;
    }
    upstream plain {
        server 127.0.0.1:%(a)d;
        server 127.0.0.1:%(b)d max_fails=1 fail_timeout=1s;
    }
    server {
        listen 127.0.0.1:{port};
        location /ramp { fastcgi_pass ramp; }
        location /plain { fastcgi_pass plain; }
    }
}
"""


def test_slow_start_ramps_a_server_back_from_failure(gannet, apps):
    """A server that failed comes back after `fail_timeout`: without slow_start it takes its
    half at once; with a long slow_start its weight is still near 0, so it gets (almost) none."""
    (a,) = apps(1)
    b = LateApp(1, apps.hold)
    try:
        srv = gannet.start(conf=SLOW_CONF % {"a": a.port, "b": b.port})
        # Round robin: the second request of each group goes to b, fails, and marks it.
        assert [ask(srv.port, p) for p in ("/ramp", "/ramp", "/plain", "/plain")] == [0] * 4
        assert srv.error_log().count("connect() failed") == 2, srv.error_log()
        b.open()
        # The plain group's b is back once its fail_timeout ran out (the ramp group's, marked
        # first, is back too by then).
        assert wait_until(lambda: ask(srv.port, "/plain") == 1, deadline=10)
        ramp = [ask(srv.port, "/ramp") for _ in range(60)]
        plain = [ask(srv.port, "/plain") for _ in range(60)]
    finally:
        b.close()
    assert plain.count(1) == 30, plain
    assert ramp.count(1) <= 1, ramp


@pytest.mark.parametrize("method", ["ip_hash;", "hash $uri;", "random;"])
def test_slow_start_is_refused_by_hashing_and_random(gannet, method):
    r = gannet.check(http=f"upstream u {{\n{method}\nserver 127.0.0.1:9;\nserver 127.0.0.1:10 slow_start=30s;\n}}")
    assert r.returncode != 0
    assert 'balancing method does not support parameter "slow_start"' in r.stderr, r.stderr
    assert re.search(r"check\.conf:\d+", r.stderr), r.stderr
    ok = gannet.check(http="upstream u {\nleast_conn;\nserver 127.0.0.1:9 slow_start=30s;\nserver 127.0.0.1:10;\n}")
    assert ok.returncode == 0, ok.stderr
    bad = gannet.check(http="upstream u {\nserver 127.0.0.1:9 slow_start=soon;\n}")
    assert 'invalid parameter "slow_start=soon"' in bad.stderr, bad.stderr


# --- against nginx ----------------------------------------------------------------------

# Weights and a down server, so the weight slots, the rehash and the ring walk all count.
DIFF_EXTRA = {1: "weight=2", 3: "down", 5: "weight=3"}


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
@pytest.mark.parametrize("dead", [False, True], ids=["all-up", "one-dead"])
@pytest.mark.parametrize("method", ["hash $arg_k;", "hash $arg_k consistent;", "ip_hash;"])
def test_same_servers_as_nginx(gannet, apps, tmp_path, method, dead):
    """nginx and gannet, the same group of the same six apps: every key and every client
    address goes to the same app in both. With `one-dead`, a seventh server that nobody
    listens on fails on its first key, and both walk on to the same next server."""
    a = apps(6)
    if method == "ip_hash;":
        labels, ask_all = SOURCES, by_source
    else:
        labels, ask_all = WITH_EMPTY, lambda port: by_key(port, WITH_EMPTY)
    # The dead server's place in the hash (and on the ring) follows from its port: the
    # keys may all miss it. nginx says which ports a key reaches; the first such is taken.
    for attempt in range(20):
        body = upstream(method, a, DIFF_EXTRA)
        if dead:
            body += f"\n        server 127.0.0.1:{free_port()};"
        conf = CONF % {"upstream": body}
        nginx_port, nginx_tmp = free_port(), tmp_path / f"nginx{attempt}"
        nginx = NginxPeer(conf, nginx_port, tmp_path / "www", nginx_tmp)
        try:
            want = ask_all(nginx_port)
        finally:
            nginx.stop()
        nginx_failed = (nginx_tmp / "error.log").read_text(errors="replace").count("connect() failed")
        if not dead or nginx_failed:
            break
    assert nginx_failed == (1 if dead else 0), "nginx: a key reached the dead server once"
    srv = gannet.start(conf=conf)
    got = ask_all(srv.port)
    diffs = [(k, w, g) for k, w, g in zip(labels, want, got) if w != g]
    assert not diffs, f"(key, nginx, gannet): {diffs}"
    assert len(set(want)) >= 4, f"the keys reach most servers: {want}"
    assert srv.error_log().count("connect() failed") == nginx_failed, srv.error_log()
