"""ACME state kept in Redis (`state_path redis:NAME`): two gannet nodes with the same
config and the same real redis-server, a real Pebble as the CA: one order reaches Pebble
and both nodes serve the same certificate over TLS verified against Pebble's root; Redis
down at start: the error is logged and retried, and once Redis is up the certificate
comes, without a reload or a crash."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509

from conftest import Gannet, free_port, wait_port, wait_until
from test_acme import Pebble, http_port, need_pebble, served_leaf  # noqa: F401 (fixture)
from test_acme_revoke import revoke_with
from test_limit_req_redis import REDIS, Redis

pytestmark = pytest.mark.skipif(not Path(REDIS).exists(), reason="Debian's redis-server is installed by scripts/test-all.sh")

CONF = """
worker_processes 2;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log info;
events { worker_connections 64; }
http {
    access_log off;
    redis_server shared { server 127.0.0.1:@REDIS@; db 2; timeout 500ms; }
    acme_issuer pebble {
        uri @DIRECTORY@;
        ssl_trusted_certificate @MINICA@;
        state_path redis:shared;
        accept_terms_of_service;
        renewal_check 1s;
    }
    server {
        listen 127.0.0.1:@TLS@ ssl;
        server_name localhost;
        acme_certificate pebble;
        ssl_certificate $acme_certificate;
        ssl_certificate_key $acme_certificate_key;
        location / { return 200 "secure\\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        location / { return 404; }
    }
}
"""


def node_conf(pebble: Pebble, redis_port: int, tls_port: int) -> str:
    return (CONF.replace("@REDIS@", str(redis_port)).replace("@DIRECTORY@", pebble.directory)
            .replace("@MINICA@", str(pebble.minica)).replace("@TLS@", str(tls_port)))


def serial(leaf: str) -> int:
    return x509.load_pem_x509_certificate((leaf + "-----END CERTIFICATE-----\n").encode()).serial_number


def redis_get(port: int, key: str) -> bytes:
    return subprocess.run(["redis-cli", "-p", str(port), "-n", "2", "--raw", "GET", key], capture_output=True).stdout.rstrip(b"\n")


def redis_keys(port: int) -> list[str]:
    out = subprocess.run(["redis-cli", "-p", str(port), "-n", "2", "--raw", "KEYS", "*"], capture_output=True, text=True)
    return sorted(out.stdout.split())


@pytest.fixture
def pebble(tmp_path, http_port):
    """Pebble taking every validation as good: the two nodes cannot both have the one
    HTTP-01 port it validates on (the real exchange is test_acme's)."""
    need_pebble()
    p = Pebble(tmp_path, http_port, env={"PEBBLE_VA_ALWAYS_VALID": "1"})
    yield p
    p.stop()


def start_nodes(tmp_path: Path, pebble: Pebble, redis_port: int) -> list:
    nodes = []
    for i in range(2):
        g = Gannet(tmp_path / f"node{i}")
        g.tmp.mkdir()
        tls = free_port()
        srv = g.start(conf=node_conf(pebble, redis_port, tls))
        nodes.append((g, srv, tls))
    return nodes


def test_two_nodes_order_once_and_serve_the_same_certificate(tmp_path, pebble):
    redis = Redis(free_port(), tmp_path)
    redis.start()
    nodes = start_nodes(tmp_path, pebble, redis.port)
    try:
        leaves = []
        for _, srv, tls in nodes:
            wait_port(tls, srv.proc)
            leaf = wait_until(lambda: served_leaf(tls, pebble.root), deadline=60, every=0.5)
            assert leaf, f"{srv.error_log()}\n{pebble.log_path.read_text()}"
            leaves.append(leaf)
        assert serial(leaves[0]) == serial(leaves[1])
        assert pebble.orders() == 1, pebble.log_path.read_text()
        assert pebble.log_path.read_text().count("There are now 1 accounts") == 1
        # The account, the certificate and its key are in Redis; the lock is given back.
        keys = redis_keys(redis.port)
        assert "gannet:acme:pebble:account.key" in keys and "gannet:acme:pebble:account.url" in keys
        assert [k for k in keys if k.endswith(".crt")] and [k for k in keys if k.endswith(".key") and "localhost" in k]
        assert not [k for k in keys if k.endswith(".lock")]
        # Nothing on disk: no state directory beside the nodes.
        for g, _, _ in nodes:
            assert not list(g.tmp.glob("acme_*"))
        # A third node started later takes the stored certificate without ordering.
        g = Gannet(tmp_path / "node2")
        g.tmp.mkdir()
        tls = free_port()
        srv = g.start(conf=node_conf(pebble, redis.port, tls))
        nodes.append((g, srv, tls))
        wait_port(tls, srv.proc)
        leaf = wait_until(lambda: served_leaf(tls, pebble.root), deadline=30, every=0.5)
        assert leaf and serial(leaf) == serial(leaves[0]), srv.error_log()
        assert pebble.orders() == 1
        # Revoked at the CA (signed with the account key from Redis): one node replaces it
        # (`renewal_check 1s` looks at the CA's renewal information), all serve the new one.
        revoke_with(pebble, redis_get(redis.port, "gannet:acme:pebble:account.key"),
                    redis_get(redis.port, "gannet:acme:pebble:account.url").decode(), leaf + "-----END CERTIFICATE-----\n")
        renewed = []
        for _, srv, tls in nodes:
            new = wait_until(lambda: (l := served_leaf(tls, pebble.root)) and serial(l) != serial(leaf) and l, deadline=60, every=0.5)
            assert new, srv.error_log()
            renewed.append(serial(new))
        assert len(set(renewed)) == 1
        assert pebble.orders() == 2
    finally:
        for g, _, _ in nodes:
            g.close()
        redis.stop()


def test_redis_down_at_start_is_logged_and_retried(tmp_path, pebble):
    redis = Redis(free_port(), tmp_path)
    g = Gannet(tmp_path / "node")
    g.tmp.mkdir()
    tls = free_port()
    try:
        srv = g.start(conf=node_conf(pebble, redis.port, tls))
        wait_port(tls, srv.proc)
        said = 'acme: certificate for "localhost" from "pebble" failed: redis_server "shared" (127.0.0.1:%d) unavailable' % redis.port
        assert wait_until(lambda: said in srv.error_log() and "retrying in 10s" in srv.error_log(), deadline=20), srv.error_log()
        assert served_leaf(tls, pebble.root) is None
        assert pebble.orders() == 0
        worker = srv.worker_pid()
        redis.start()
        leaf = wait_until(lambda: served_leaf(tls, pebble.root), deadline=60, every=0.5)
        assert leaf, srv.error_log()
        assert srv.worker_pids() == [worker]
        assert [k for k in redis_keys(redis.port) if k.endswith(".crt")]
        assert pebble.orders() == 1
    finally:
        g.close()
        redis.stop()


def accept_each(sock: socket.socket, handle):
    """`handle` each connection `sock` accepts, until it is closed."""
    while True:
        try:
            client, _ = sock.accept()
        except OSError:
            return
        handle(client)


class ToTheOtherNode:
    """Pebble's HTTP-01 port, forwarded to the node that is not ordering (the one whose log
    does not say it made the account): the CA's validation request reaches a node that
    only knows the token from Redis."""

    def __init__(self, port: int, nodes: list):
        self.nodes, self.reached = nodes, []
        self.sock = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=accept_each, args=(self.sock, self.forward), daemon=True).start()

    def forward(self, client: socket.socket):
        others = [srv for srv in self.nodes if "acme: account" not in srv.error_log()]
        if len(others) != 1:
            client.close()
            return
        self.reached.append(others[0])
        self.join(client, others[0].port)

    @classmethod
    def join(cls, client: socket.socket, port: int):
        """Relay `client` to `port` both ways."""
        upstream = socket.create_connection(("127.0.0.1", port))
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=cls.pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def pipe(a: socket.socket, b: socket.socket):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def subscribers(redis_port: int, channel: str) -> int:
    out = subprocess.run(["redis-cli", "-p", str(redis_port), "--raw", "PUBSUB", "NUMSUB", channel],
                         capture_output=True, text=True).stdout.split()
    return int(out[1]) if len(out) == 2 and out[1].isdigit() else 0


class Gate:
    """Pebble's directory behind a door, opened by the test: a node that subscribed to the
    challenge channel after the other published its token would not know it (the CA's
    request to it finds no answer and the order fails, to be retried), so the nodes reach
    the CA only once both listen."""

    def __init__(self, port: int):
        self.port, self.opened = port, threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        # Each connection waits in a thread of its own until the gate opens.
        threading.Thread(target=accept_each, daemon=True, args=(
            self.sock, lambda c: threading.Thread(target=self.through, args=(c,), daemon=True).start())).start()

    def through(self, client: socket.socket):
        self.opened.wait(60)
        ToTheOtherNode.join(client, self.port)

    def directory(self, pebble: Pebble) -> str:
        return pebble.directory.replace(f":{pebble.port}/", f":{self.sock.getsockname()[1]}/")


def test_http01_answered_by_the_node_that_does_not_order(tmp_path, http_port):
    """Real HTTP-01 validation (no PEBBLE_VA_ALWAYS_VALID) reaching only the other node: the
    ordering node tells the token over Redis pub/sub, and the order succeeds."""
    need_pebble()
    pebble = Pebble(tmp_path, http_port)
    redis = Redis(free_port(), tmp_path)
    redis.start()
    gate = Gate(pebble.port)
    channel = "gannet:acme:pebble:challenges"
    started = []
    try:
        for i in range(2):
            g = Gannet(tmp_path / f"node{i}")
            g.tmp.mkdir()
            tls = free_port()
            conf = node_conf(pebble, redis.port, tls).replace(pebble.directory, gate.directory(pebble))
            started.append((g, g.start(conf=conf), tls))
            # Each node's subscription in place before the next starts and before either
            # reaches the CA.
            assert wait_until(lambda: subscribers(redis.port, channel) > i, deadline=20), started[-1][1].error_log()
        gate.opened.set()
        proxy = ToTheOtherNode(http_port, [srv for _, srv, _ in started])
        leaves = []
        for _, srv, tls in started:
            wait_port(tls, srv.proc)
            leaf = wait_until(lambda: served_leaf(tls, pebble.root), deadline=60, every=0.5)
            assert leaf, f"{srv.error_log()}\n{pebble.log_path.read_text()}"
            leaves.append(leaf)
        assert serial(leaves[0]) == serial(leaves[1])
        assert proxy.reached, "the CA's validation request did not come"
        assert pebble.orders() == 1, pebble.log_path.read_text()
        proxy.close()
    finally:
        gate.sock.close()
        for g, _, _ in started:
            g.close()
        redis.stop()
        pebble.stop()
