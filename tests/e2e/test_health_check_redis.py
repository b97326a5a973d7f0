"""Active health-check results shared through Redis (`health_check ... redis=name`): node A
probes often, node B almost never; when A finds a server sick, B stops sending it requests
too, and sends them again when A finds it well."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Gannet, free_port, wait_until
from nginx_peer import PEER_MAIN
from rawapps import HttpApp, http_answer, made
from test_cache_purge_redis import redis_numsub
from test_limit_req_redis import REDIS, Redis

pytestmark = pytest.mark.skipif(not Path(REDIS).exists(), reason="Debian's redis-server is installed by scripts/test-all.sh")


@pytest.fixture
def redis(tmp_path):
    r = Redis(free_port(), tmp_path)
    r.start()
    yield r
    r.stop()


@pytest.fixture
def app():
    yield from made(HttpApp)


def conf(redis_port: int, a: int, b: int, interval: str) -> str:
    return PEER_MAIN + f"""
http {{
    access_log off;
    redis_server shared {{ server 127.0.0.1:{redis_port}; }}
    upstream pool {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}
    server {{
        listen 127.0.0.1:{{port}};
        location / {{ proxy_pass http://pool; health_check interval={interval} uri=/health redis=shared; }}
    }}
}}
"""


def test_a_verdict_of_one_node_holds_on_the_other(tmp_path, redis, app):
    state = {"sick": False}

    def serve(name):
        def behave(conn, head, body):
            if head.startswith(b"GET /health"):
                bad = name == "b" and state["sick"]
                conn.sendall(http_answer(b"no", "500 Internal Server Error") if bad else http_answer(b"ok"))
                return None
            conn.sendall(http_answer(name.encode()))
            return None
        return behave

    a, b = app(serve("a")), app(serve("b"))
    nodes = []
    try:
        for name, interval in (("prober", "100ms"), ("idle", "1h")):
            g = Gannet(tmp_path / name)
            g.tmp.mkdir()
            nodes.append((g, g.start(conf=conf(redis.port, a.port, b.port, interval))))
        prober, idle = (s for _, s in nodes)
        assert wait_until(lambda: redis_numsub(redis, "gannet:health:pool") == 2)
        # The idle node probed once, at its start: both servers serve.
        assert {idle.get(f"/{i}")[2] for i in range(6)} == {b"a", b"b"}

        state["sick"] = True
        assert wait_until(lambda: f"127.0.0.1:{b.port} of \"pool\" is unhealthy (said by another node)" in idle.error_log())
        # b still answers requests: only the shared verdict keeps the idle node from it.
        assert {idle.get(f"/{i}")[2] for i in range(6)} == {b"a"}
        assert f"127.0.0.1:{b.port} of \"pool\" is unhealthy: answer 500" in prober.error_log()

        state["sick"] = False
        assert wait_until(lambda: f"127.0.0.1:{b.port} of \"pool\" is healthy again (said by another node)" in idle.error_log())
        assert {idle.get(f"/{i}")[2] for i in range(6)} == {b"a", b"b"}
    finally:
        for g, _ in nodes:
            g.close()


def test_unknown_redis_server_is_a_config_error(gannet):
    r = gannet.check(http="upstream u { server 127.0.0.1:9; }", server="location / { proxy_pass http://u; health_check redis=nope; }")
    assert r.returncode != 0 and 'unknown redis_server "nope"' in r.stderr, r.stderr
