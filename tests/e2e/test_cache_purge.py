"""Cache purge (`proxy_cache_purge`, `fastcgi_cache_purge`: nginx Plus's), the background
update of an expired entry (`proxy_cache_background_update`, compared with Debian's nginx)
and the caches' families on the `metrics` page."""

from __future__ import annotations

import http.client
import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from cacheapp import CacheApp
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side

PURGE_CONF = r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m max_size=10m;
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
        # Purges of any key (?k=), behind allow/deny or not.
        location /guarded/ {
            deny all;
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_key $arg_k;
            proxy_cache_purge $purge_method;
        }
        location /open/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_key $arg_k;
            proxy_cache_purge $purge_method;
        }
        location = /metrics { metrics; }
    }
}
events { worker_connections 256; }
worker_processes @WORKERS@;
"""


@pytest.fixture
def app():
    a = CacheApp()
    yield a
    try:
        a.stop()
    except OSError:
        pass


def ask(port: int, path: str, method: str = "GET") -> tuple[int, str, bytes, float]:
    """One request on its own connection: status, X-Cache, body, seconds until the whole
    answer (by its length) was read."""
    t = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path)
    r = c.getresponse()
    body = r.read()
    took = time.monotonic() - t
    c.close()
    return r.status, r.getheader("X-Cache", ""), body, took


def stored(port, paths):
    """Wait until each path's entry is in place (it is as its answer ends)."""
    for p in paths:
        assert wait_until(lambda: ask(port, p)[1] == "HIT"), p


def start(gannet, app, workers=1):
    return gannet.start(conf=PURGE_CONF.replace("@UP@", str(app.port)).replace("@WORKERS@", str(workers)))


def test_purge_removes_the_key_and_says_404_for_none(gannet, app):
    srv = start(gannet, app)
    assert ask(srv.port, "/a")[1] == "MISS"
    # A streamed answer's entry is committed just after the answer ends: wait for it.
    stored(srv.port, ["/a"])
    assert ask(srv.port, "/a")[1] == "HIT"
    assert ask(srv.port, "/b")[1] == "MISS"
    stored(srv.port, ["/b"])
    # How often /a was fetched so far (waiting for its entry may have asked again).
    fetched = app.count("", "/a")
    status, _, body, _ = ask(srv.port, "/a", "PURGE")
    assert (status, body) == (204, b"")
    status, st, body, _ = ask(srv.port, "/a")
    assert (status, st) == (200, "MISS") and f"count={fetched + 1}".encode() in body
    # Only that key: /b is still there.
    assert ask(srv.port, "/b")[1] == "HIT"
    # Nothing (left) to purge.
    assert ask(srv.port, "/nothing", "PURGE")[0] == 404
    assert ask(srv.port, "/b", "PURGE")[0] == 204
    assert ask(srv.port, "/b", "PURGE")[0] == 404
    assert app.count("", "/a") == fetched + 1


def test_wildcard_purges_only_the_prefix(gannet, app):
    srv = start(gannet, app)
    for p in ("/w/a1", "/w/a2", "/w/ab/c", "/w/b1", "/x/a1"):
        assert ask(srv.port, p)[1] == "MISS"
    stored(srv.port, ("/w/a1", "/w/a2", "/w/ab/c", "/w/b1", "/x/a1"))
    assert ask(srv.port, "/w/a*", "PURGE")[0] == 204
    for p in ("/w/a1", "/w/a2", "/w/ab/c"):
        assert ask(srv.port, p)[1] == "MISS", p
    for p in ("/w/b1", "/x/a1"):
        assert ask(srv.port, p)[1] == "HIT", p
    assert ask(srv.port, "/w/zz*", "PURGE")[0] == 404
    # Every key.
    assert ask(srv.port, "/*", "PURGE")[0] == 204
    assert ask(srv.port, "/w/b1")[1] == "MISS"


def test_deny_applies_before_the_purge(gannet, app):
    srv = start(gannet, app)
    assert ask(srv.port, "/kept")[1] == "MISS"
    stored(srv.port, ["/kept"])
    assert ask(srv.port, "/guarded/?k=/kept", "PURGE")[0] == 403
    assert ask(srv.port, "/kept")[1] == "HIT"
    # The same purge where it is allowed removes it: another location, the same zone.
    assert ask(srv.port, "/open/?k=/kept", "PURGE")[0] == 204
    assert ask(srv.port, "/kept")[1] == "MISS"


def test_purge_with_two_workers_and_after_a_restart(gannet, app):
    """`worker_processes 2`: two event loops, one index; then a new process whose index has
    not seen the entries it purges (they are found in their files)."""
    srv = start(gannet, app, workers=2)
    paths = [f"/many/{i}" for i in range(24)]
    for p in paths:
        assert ask(srv.port, p)[:2] == (200, "MISS")
    stored(srv.port, paths)
    for p in paths:
        assert ask(srv.port, p, "PURGE")[0] == 204, p
    for p in paths:
        assert ask(srv.port, p)[1] == "MISS", p
    srv.stop()
    srv = start(gannet, app, workers=2)
    assert ask(srv.port, "/many/0", "PURGE")[0] == 204
    assert ask(srv.port, "/many/0")[1] == "MISS"
    assert ask(srv.port, "/many/*", "PURGE")[0] == 204
    for p in paths:
        assert ask(srv.port, p)[1] == "MISS", p
    assert app.count("", "/many/5") == 3


def samples(text):
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^([a-z0-9_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def test_metrics_count_lookups_purges_and_size(gannet, app):
    srv = start(gannet, app)
    seen = Counter()

    def get(p):
        st = ask(srv.port, p)[1]
        seen[st] += 1
        return st

    assert get("/m1") == "MISS" and get("/m2") == "MISS"
    # Until both entries are in place (they are as their answers end).
    assert wait_until(lambda: get("/m1") == "HIT" and get("/m2") == "HIT")
    assert get("/m1") == "HIT"
    assert ask(srv.port, "/m*", "PURGE")[0] == 204
    page = samples(ask(srv.port, "/metrics")[2].decode())
    z = 'zone="one"'
    assert page[f'gannet_cache_responses_total{{{z},status="hit"}}'] == seen["HIT"]
    assert page[f'gannet_cache_responses_total{{{z},status="miss"}}'] == seen["MISS"]
    assert page[f'gannet_cache_responses_total{{{z},status="stale"}}'] == 0
    assert page[f"gannet_cache_purged_total{{{z}}}"] == 2
    assert page[f"gannet_cache_max_size_bytes{{{z}}}"] == 10 * 1024 * 1024
    assert page[f"gannet_cache_entries{{{z}}}"] == 0
    assert ask(srv.port, "/m3")[1] == "MISS"

    def entries():
        return [p for p in (Path(gannet.tmp) / "cache").rglob("*") if p.is_file() and len(p.name) == 32]

    # The entry is put in place as the answer ends.
    assert wait_until(lambda: len(entries()) == 1)
    entry = entries()
    text = ask(srv.port, "/metrics")[2]
    page = samples(text.decode())
    assert page[f"gannet_cache_entries{{{z}}}"] == 1
    assert page[f"gannet_cache_size_bytes{{{z}}}"] == entry[0].stat().st_size
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
        assert r.returncode == 0, (r.stdout, r.stderr)


BG_CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m;
    proxy_set_header X-Who $server_port;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_use_stale updating;
            proxy_cache_background_update on;
        }
        # No proxy_cache_use_stale: the answers' own stale-while-revalidate and
        # stale-if-error decide.
        location /own/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_background_update on;
            proxy_ignore_headers Set-Cookie;
            proxy_ignore_headers Vary;
        }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_background_update_serves_stale_at_once_like_nginx(tmp_path, app):
    path = "/bg?xae=1&delay=1.5"
    with side_by_side(tmp_path, BG_CONF.replace("@UP@", str(app.port))) as (srv, nginx_port):
        for port in (nginx_port, srv.port):
            assert ask(port, path)[1] == "MISS"
        until = time.time() + 2.2
        assert wait_until(lambda: time.time() >= until, deadline=10)
        for port in (nginx_port, srv.port):
            status, st, body, took = ask(port, path)
            # The old entry at once, while the application takes 1.5 s for the new one.
            assert (status, st) == (200, "STALE"), port
            assert b"count=1" in body and took < 1.0, (port, took)
            assert wait_until(lambda: app.count(str(port), path) == 2)
            # While the update runs: the old entry (UPDATING); then the new one.
            fresh = []
            assert wait_until(lambda: (fresh.append(ask(port, path)) or fresh[-1][1] == "HIT"), deadline=10)
            assert b"count=2" in fresh[-1][2], port
            assert {a[1] for a in fresh} <= {"UPDATING", "HIT"}, (port, [a[1] for a in fresh])
            assert app.count(str(port), path) == 2


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_stale_while_revalidate_and_stale_if_error_like_nginx(tmp_path, app):
    """Cache-Control's extensions stand in for `proxy_cache_use_stale`: within
    stale-while-revalidate the expired entry is served (STALE) while the background update
    runs; within stale-if-error it is served when the upstream is gone; past them not."""
    swr = "/own/swr?cc=max-age=1,%20stale-while-revalidate=30&delay=1"
    sie = "/own/sie?cc=max-age=1,%20stale-if-error=30&cookie=1"
    plain = "/own/plain?cc=max-age=1"
    with side_by_side(tmp_path, BG_CONF.replace("@UP@", str(app.port))) as (srv, nginx_port):
        ports = (nginx_port, srv.port)
        for port in ports:
            for p in (swr, sie, plain):
                assert ask(port, p)[1] == "MISS", (port, p)
        until = time.time() + 2.2
        assert wait_until(lambda: time.time() >= until, deadline=10)
        for port in ports:
            status, st, body, took = ask(port, swr)
            assert (status, st) == (200, "STALE") and b"count=1" in body and took < 0.9, (port, st, took)
            assert wait_until(lambda: ask(port, swr)[1] == "HIT", deadline=10), port
        app.stop()
        for port in ports:
            status, st, body, _ = ask(port, sie)
            assert (status, st) == (200, "STALE") and b"count=1" in body, (port, status, st)
            # Without the extension, the failure is the answer.
            assert ask(port, plain)[:2] == (502, "EXPIRED"), port


def test_purge_over_http2(gannet, app):
    """The HTTP/2 path runs the same purge code."""
    conf = PURGE_CONF.replace("@UP@", str(app.port)).replace("@WORKERS@", "1")
    srv = gannet.start(conf=conf.replace("listen 127.0.0.1:{port};", "listen 127.0.0.1:{port}; http2 on;"))

    def curl(method, path):
        r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-X", method, "-o", "/dev/null",
                            "-w", "%{http_version} %{http_code}", f"http://127.0.0.1:{srv.port}{path}"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout

    assert ask(srv.port, "/h2")[1] == "MISS"
    stored(srv.port, ["/h2"])
    assert curl("PURGE", "/h2") == "2 204"
    assert curl("PURGE", "/h2") == "2 404"
    assert ask(srv.port, "/h2")[1] == "MISS"
    assert curl("PURGE", "/guarded/?k=/h2") == "2 403"
