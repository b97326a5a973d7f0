"""The copies of hot entries each worker thread keeps (`cache::hot`): a new answer stored
for the key (a bypassed request's), or a purge, is seen by the very next request on every
thread, even within `open_file_cache_valid`. Two worker threads, each request on its own
connection so both threads serve (and keep) the entry."""

from __future__ import annotations

import pytest

from cacheapp import CacheApp
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = r"""
worker_processes 2;
events { worker_connections 256; }
http {
    access_log off;
    open_file_cache max=100 inactive=60s;
    open_file_cache_valid 60s;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m;
    map $request_method $purge_method { PURGE 1; default 0; }
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_bypass $http_x_bypass;
            proxy_cache_purge $purge_method;
        }
    }
}
"""


@pytest.fixture
def app():
    a = CacheApp()
    yield a
    a.stop()


def ask(port: int, method: str = "GET", headers: str = "") -> tuple[int, str, bytes]:
    a = exchange(port, f"{method} /hot HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n".encode())
    return a.status, a.headers.get("x-cache", ""), a.body


def test_kept_entries_follow_a_new_answer_and_a_purge(gannet, app):
    srv = gannet.start(conf=CONF.replace("@UP@", str(app.port)))
    first = ask(srv.port)
    assert first[:2] == (200, "MISS") and first[2].endswith(b"count=1 lang=\n"), first
    for _ in range(8):
        assert ask(srv.port) == (200, "HIT", first[2])
    # A bypassed request stores a new answer: every thread serves it from then on.
    new = ask(srv.port, headers="X-Bypass: 1\r\n")
    assert new[:2] == (200, "BYPASS") and new[2].endswith(b"count=2 lang=\n"), new
    for _ in range(8):
        assert ask(srv.port) == (200, "HIT", new[2])
    # A purge: the next request fetches again, and the later ones get that answer.
    assert ask(srv.port, "PURGE")[0] == 204
    again = ask(srv.port)
    assert again[:2] == (200, "MISS") and again[2].endswith(b"count=3 lang=\n"), again
    for _ in range(8):
        assert ask(srv.port) == (200, "HIT", again[2])
    assert app.count("", "/hot") == 3


# Two locations share one key (`$arg_k`), so one kept entry serves both: each gets the head
# its own settings make (Set-Cookie hidden in /b/ only), and a Location the proxy rewrites
# for the request's Host (`proxy_redirect` with `$host`) is rewritten per request, not once
# per entry.
PER_LOCATION = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m;
    proxy_set_header X-Who $server_port;
    proxy_cache_key $arg_k;
    proxy_cache_valid 200 301 10m;
    proxy_ignore_headers Set-Cookie;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location /a/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_redirect http://127.0.0.1:@UP@/ http://$host/;
        }
        location /b/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_hide_header Set-Cookie;
            proxy_redirect http://127.0.0.1:@UP@/ http://$host/b/;
        }
    }
}
"""

STEPS = [
    ("/a/c?k=c&cookie=1", "one.test"),
    ("/b/c?k=c&cookie=1", "one.test"),
    ("/a/c?k=c&cookie=1", "one.test"),
    ("/b/c?k=c&cookie=1", "two.test"),
    ("/a/l?k=l&status=301&loc=/there", "one.test"),
    ("/a/l?k=l&status=301&loc=/there", "two.test"),
    ("/a/l?k=l&status=301&loc=/there", "three.test"),
    ("/a/l?k=l&status=301&loc=/there", "four.test"),
    ("/b/l?k=l&status=301&loc=/there", "five.test"),
    ("/b/l?k=l&status=301&loc=/there", "six.test"),
    ("/a/l?k=l&status=301&loc=/there", "seven.test"),
]


def ask_at(port: int, path: str, host: str) -> tuple:
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    h = a.headers
    return a.status, h.get("x-cache", ""), h.get("set-cookie"), h.get("location"), a.body


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_kept_entry_head_is_each_locations_and_each_requests(tmp_path, app):
    conf = PER_LOCATION.replace("@UP@", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got = [(s, ask_at(nginx_port, *s), ask_at(srv.port, *s)) for s in STEPS]
        diffs = [f"{s}:\n  nginx  {n}\n  gannet {g}" for s, n, g in got if n[:4] != g[:4]]
        assert not diffs, "\n".join(diffs)
        g = [x[2] for x in got]
        assert [x[1] for x in g] == ["MISS"] + ["HIT"] * 3 + ["MISS"] + ["HIT"] * 6, g
        assert [x[2] for x in g[:4]] == ["a=b", None, "a=b", None], g
        assert [x[3] for x in g[4:]] == [
            "http://one.test/there",
            "http://two.test/there",
            "http://three.test/there",
            "http://four.test/there",
            "http://five.test/b/there",
            "http://six.test/b/there",
            "http://seven.test/there",
        ], g
        # One fetch per key: every later answer came from the entry.
        assert app.count(str(srv.port), "/a/c?k=c&cookie=1") == 1
        assert app.count(str(srv.port), "/a/l?k=l&status=301&loc=/there") == 1
