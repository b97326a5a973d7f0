"""limit_conn zones kept in Redis (`limit_conn_zone ... redis=name`): requests in progress
on three gannet nodes count against one limit through a real redis-server; a node that
dies stops counting once its lease runs out; Redis stopped: the zone's fail mode; Redis
started again: counted again without a reload."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
from pathlib import Path

import pytest

import rawapps
from conftest import Gannet, free_port, wait_until
from nginx_peer import PEER_MAIN
from test_limit_req_redis import REDIS, Redis

pytestmark = pytest.mark.skipif(not Path(REDIS).exists(), reason="Debian's redis-server is installed by scripts/test-all.sh")

MAX = 2


class Holding(rawapps.HttpApp):
    """An application that answers each request only once the test lets it go."""

    def __init__(self):
        self.go = threading.Event()
        super().__init__(self.answer)

    def answer(self, conn, head, body):
        self.go.wait(30)
        conn.sendall(rawapps.http_answer(b"done\n", keep=False))


@pytest.fixture
def redis(tmp_path):
    r = Redis(free_port(), tmp_path)
    r.start()
    yield r
    r.stop()


@pytest.fixture
def app():
    a = Holding()
    yield a
    a.go.set()
    a.close()


def node_conf(redis_port: int, app_port: int) -> str:
    return PEER_MAIN + f"""
http {{
    access_log off;
    redis_server shared {{ server 127.0.0.1:{redis_port}; timeout 5s; }}
    limit_conn_zone $server_name zone=open:1m redis=shared;
    limit_conn_zone $server_name zone=shut:1m redis=shared fail_closed;
    server {{
        listen 127.0.0.1:{{port}};
        server_name cluster;
        location /open/ {{ limit_conn open {MAX}; proxy_pass http://127.0.0.1:{app_port}; }}
        location /shut/ {{ limit_conn shut {MAX}; proxy_pass http://127.0.0.1:{app_port}; }}
    }}
}}
"""


@pytest.fixture
def nodes(tmp_path, redis, app):
    started = []
    for i in range(3):
        g = Gannet(tmp_path / f"node{i}")
        g.tmp.mkdir()
        started.append((g, g.start(conf=node_conf(redis.port, app.port))))
    yield [s for _, s in started]
    app.go.set()
    for g, _ in started:
        g.close()


def hold(node, path: str) -> socket.socket:
    """Send a request and leave it in progress (the answer is not read)."""
    s = socket.create_connection(("127.0.0.1", node.port), timeout=10)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: cluster\r\n\r\n".encode())
    return s


def status(node, path: str) -> int:
    """A request that the application answers at once (or a refusal)."""
    return node.get(path, headers={"Host": "cluster"})[0]


def test_requests_in_progress_count_on_every_node(nodes, app):
    a, b, c = nodes
    held = [hold(a, "/open/"), hold(b, "/open/")]
    try:
        # Both reached the application: they are counted (on two nodes).
        assert wait_until(lambda: len(app.requests) == 2)
        # A third node sees the cluster at its limit (unshared, it would take two more).
        assert status(c, "/open/") == 503
        assert status(a, "/open/") == 503
        assert re.search(r'\[error\] .*limiting connections by zone "open"', c.error_log())
        # One ends: its node takes it off in Redis, and the third node may serve one again.
        app.go.set()
        for s in held:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        assert wait_until(lambda: status(c, "/open/") == 200)
    finally:
        for s in held:
            s.close()


def test_a_dead_nodes_requests_stop_counting_after_its_lease(nodes, app):
    a, b, _ = nodes
    held = [hold(a, "/open/"), hold(a, "/open/")]
    try:
        assert wait_until(lambda: len(app.requests) == 2)
        assert status(b, "/open/") == 503
        # The node dies without giving its requests back (SIGKILL: no clean-up at all).
        os.kill(a.worker_pid(), signal.SIGKILL)
        # Its lease (6 s, renewed every 2 s) has seconds left: still counted.
        assert status(b, "/open/") == 503
        # Then its counts go, and node b serves again (the application answers at once now).
        app.go.set()
        assert wait_until(lambda: status(b, "/open/") == 200, deadline=15, every=0.2)
    finally:
        for s in held:
            s.close()


def test_redis_down_fails_open_or_closed_then_counts_again(nodes, app, redis):
    a, b, c = nodes
    app.go.set()
    assert status(a, "/open/") == 200 and status(a, "/shut/") == 200
    redis.stop()
    # fail_open: served, counted nowhere; fail_closed: refused.
    app.go.clear()
    held = [hold(a, "/open/"), hold(b, "/open/"), hold(c, "/open/")]
    try:
        assert wait_until(lambda: len(app.requests) == 5)
        assert status(b, "/shut/") == 503
        assert len(re.findall(r'limit_conn zone "open" fails open: redis_server "shared"', a.error_log())) == 1
        assert re.search(r'limit_conn zone "shut" fails closed: redis_server "shared"', b.error_log())
        app.go.set()
        for s in held:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()
    redis.start()
    # Without a reload: each node retries a second after a failure; the fail_closed zone
    # serving again says the node counts in Redis again.
    for n in nodes:
        assert wait_until(lambda: status(n, "/shut/") == 200, deadline=10, every=0.1)
    app.go.clear()
    base = len(app.requests)
    held = [hold(a, "/open/"), hold(b, "/open/")]
    try:
        assert wait_until(lambda: len(app.requests) == base + 2)
        assert status(c, "/open/") == 503
        assert any('limit_conn zone "open" is shared again: redis_server "shared"' in n.error_log() for n in nodes)
    finally:
        app.go.set()
        for s in held:
            s.close()


@pytest.mark.parametrize(
    "http, message",
    [
        ("limit_conn_zone $uri zone=a:1m redis=nope;", 'unknown redis_server "nope"'),
        ("limit_conn_zone $uri zone=a:1m fail_closed;", '"fail_open" and "fail_closed" need "redis="'),
        ("limit_conn_zone $uri zone=a:1m x;", 'invalid number of arguments in "limit_conn_zone" directive'),
        ("redis_server r { server 127.0.0.1; } limit_conn_zone $uri zone=a:1m redis=r x;", 'invalid parameter "x"'),
    ],
)
def test_bad_limit_conn_zone_is_a_config_error(gannet, http, message):
    r = gannet.check(http=http)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
