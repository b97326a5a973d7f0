"""Cache purges sent to every node (`proxy_cache_path ... redis=name`): two gannet nodes with
caches of their own, one real redis-server; a purge on one node removes the entry on the
other (one key, and a prefix), and after Redis was stopped and started again the nodes
listen again without a reload."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from cacheapp import CacheApp
from conftest import Gannet, free_port, wait_until
from nginx_peer import PEER_MAIN
from test_cache_purge import ask, stored
from test_limit_req_redis import REDIS, Redis

pytestmark = pytest.mark.skipif(not Path(REDIS).exists(), reason="Debian's redis-server is installed by scripts/test-all.sh")

CONF = PEER_MAIN + r"""
http {
    access_log off;
    redis_server shared { server 127.0.0.1:@REDIS@; }
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m redis=shared;
    map $request_method $purge_method { PURGE 1; default 0; }
    add_header X-Cache $upstream_cache_status always;
    proxy_cache_valid 200 10m;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_key $uri;
            proxy_cache_purge $purge_method;
        }
    }
}
"""


@pytest.fixture
def redis(tmp_path):
    r = Redis(free_port(), tmp_path)
    r.start()
    yield r
    r.stop()


@pytest.fixture
def app():
    a = CacheApp()
    yield a
    try:
        a.stop()
    except OSError:
        pass


@pytest.fixture
def nodes(tmp_path, redis, app):
    started = []
    for i in range(2):
        g = Gannet(tmp_path / f"node{i}")
        g.tmp.mkdir()
        conf = CONF.replace("@REDIS@", str(redis.port)).replace("@UP@", str(app.port))
        started.append((g, g.start(conf=conf)))
    yield [s for _, s in started]
    for g, _ in started:
        g.close()


def entry(node, key: str) -> Path:
    """Where the node keeps `key`'s entry (levels=1:2, named by the key's md5)."""
    h = hashlib.md5(key.encode()).hexdigest()
    return node.tmp / "cache" / h[-1] / h[-3:-1] / h


def test_a_purge_on_one_node_removes_the_entry_on_the_other(nodes, redis):
    a, b = nodes
    paths = ["/a", "/b", "/w/1", "/w/2"]
    for n in nodes:
        for p in paths:
            ask(n.port, p)
        stored(n.port, paths)
    assert all(entry(n, p).exists() for n in nodes for p in paths)
    # Each node's first worker listens on the zone's channel.
    assert wait_until(lambda: redis_numsub(redis, "gannet:purge:one") == 2)

    assert ask(a.port, "/a", "PURGE")[0] == 204
    assert wait_until(lambda: not entry(b, "/a").exists())
    assert ask(b.port, "/a")[1] == "MISS"
    assert ask(b.port, "/b")[1] == "HIT"

    # A prefix, the other way round; a node that had none still sends it (404 there).
    assert ask(b.port, "/w/*", "PURGE")[0] == 204
    assert wait_until(lambda: not entry(a, "/w/1").exists() and not entry(a, "/w/2").exists())
    assert ask(a.port, "/b")[1] == "HIT"
    stored(a.port, ["/w/1"])
    assert ask(a.port, "/w/1", "PURGE")[0] == 204
    assert ask(a.port, "/w/1", "PURGE")[0] == 404


def test_nodes_listen_again_when_redis_is_back(nodes, redis):
    a, b = nodes
    assert wait_until(lambda: redis_numsub(redis, "gannet:purge:one") == 2)
    redis.stop()
    # The nodes find Redis gone and say so once.
    assert wait_until(lambda: all("cannot listen on \"gannet:purge:one\"" in n.error_log() for n in nodes), deadline=10)
    ask(b.port, "/k")
    stored(b.port, ["/k"])
    # Sent while Redis is down: this node's entry goes, the other's stays, and it is said.
    ask(a.port, "/k")
    stored(a.port, ["/k"])
    assert ask(a.port, "/k", "PURGE")[0] == 204
    assert re.search(r'\[error\] .*cache purge of "/k" in zone "one" not sent to the other nodes: redis_server "shared"', a.error_log())
    assert entry(b, "/k").exists()

    redis.start()
    # Without a reload: both listen again, and purges reach the other node again.
    assert wait_until(lambda: redis_numsub(redis, "gannet:purge:one") == 2, deadline=10)
    assert all("listening on \"gannet:purge:one\" again" in n.error_log() for n in nodes)
    assert wait_until(lambda: ask(a.port, "/k", "PURGE")[0] in (204, 404) and not entry(b, "/k").exists(), deadline=10)


def redis_numsub(redis, channel: str) -> int:
    """How many connections are subscribed to `channel`."""
    out = subprocess.run(["redis-cli", "-p", str(redis.port), "pubsub", "numsub", channel], capture_output=True, text=True, timeout=10).stdout.split()
    return int(out[1]) if len(out) == 2 and out[1].isdigit() else 0
