"""The proxy's response cache (`proxy_cache_path`, `proxy_cache`, `proxy_cache_valid`,
`proxy_cache_bypass`, `proxy_no_cache`, `proxy_cache_use_stale`, `proxy_cache_lock`...),
compared with Debian's nginx on one config: both proxy to one application (`cacheapp`),
which counts the requests of each server apart (`X-Who: $server_port`) and puts the count
in the body, and every answer's status, `$upstream_cache_status` (sent as `X-Cache`) and
body must be the same. Then what only gannet is asked: the lock's single fetch, a restart
keeping an entry, `max_size`."""

from __future__ import annotations

import hashlib
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cacheapp import CacheApp
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m inactive=10m;
    proxy_set_header X-Who $server_port;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_bypass $http_x_bypass;
            proxy_no_cache $arg_nocache;
        }
        location /stale/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_use_stale error timeout updating http_500;
        }
        location /ignore/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_ignore_headers Set-Cookie Cache-Control;
        }
        location /reval/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_revalidate on;
        }
        location /nohead/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_convert_head off;
            proxy_cache_key $request_method$uri;
        }
        location /minuses/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_min_uses 2;
        }
        location /var/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache $arg_c;
            proxy_cache_valid 200 10m;
        }
        location /unbuffered/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_buffering off;
        }
        location /nocache/ {
            proxy_pass http://127.0.0.1:@UP@;
        }
    }
}
"""


@pytest.fixture
def app():
    a = CacheApp()
    yield a
    try:
        a.stop()
    except OSError:
        pass


def ask(port: int, path: str, method: str = "GET", headers: str = "") -> tuple[int, str, bytes]:
    a = exchange(port, f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n".encode())
    # Error pages name their server: not a difference.
    body = re.sub(rb"<center>(nginx|gannet)/[^<]*</center>", b"<center>SERVER</center>", a.body)
    body = body if len(body) < 200 else f"{len(a.body)} bytes, md5 {hashlib.md5(a.body).hexdigest()}".encode()
    return a.status, a.headers.get("x-cache", ""), body


def seconds_pass(n: float) -> None:
    """Entries expire by the clock: wait until it has moved `n` seconds on."""
    until = time.time() + n
    assert wait_until(lambda: time.time() >= until, deadline=n + 5)


# Each step: (path, method, extra headers). Run in order on both servers.
STEPS = [
    ("/a", "GET", ""),
    ("/a", "GET", ""),
    ("/a", "GET", "X-Bypass: 1\r\n"),
    ("/a", "GET", ""),
    ("/a", "HEAD", ""),
    ("/h", "HEAD", ""),
    ("/h", "GET", ""),
    ("/n?nocache=1", "GET", ""),
    ("/n?nocache=1", "GET", ""),
    ("/ns?cc=no-store", "GET", ""),
    ("/ns?cc=no-store", "GET", ""),
    ("/p?cc=private", "GET", ""),
    ("/p?cc=private", "GET", ""),
    ("/nc?cc=no-cache", "GET", ""),
    ("/nc?cc=no-cache", "GET", ""),
    ("/ma0?cc=max-age=0", "GET", ""),
    ("/ma0?cc=max-age=0", "GET", ""),
    ("/x0?xae=0", "GET", ""),
    ("/x0?xae=0", "GET", ""),
    ("/c?cookie=1", "GET", ""),
    ("/c?cookie=1", "GET", ""),
    ("/ignore/c?cookie=1&cc=no-store", "GET", ""),
    ("/ignore/c?cookie=1&cc=no-store", "GET", ""),
    ("/e404?status=404", "GET", ""),
    ("/e404?status=404", "GET", ""),
    ("/x404?status=404&xae=60", "GET", ""),
    ("/x404?status=404&xae=60", "GET", ""),
    ("/v?vary=Accept-Language", "GET", "Accept-Language: en\r\n"),
    ("/v?vary=Accept-Language", "GET", "Accept-Language: fr\r\n"),
    ("/v?vary=Accept-Language", "GET", "Accept-Language: en\r\n"),
    ("/v?vary=Accept-Language", "GET", "Accept-Language: fr\r\n"),
    ("/vs?vary=*", "GET", ""),
    ("/vs?vary=*", "GET", ""),
    ("/post", "POST", "Content-Length: 0\r\n"),
    ("/post", "POST", "Content-Length: 0\r\n"),
    ("/nocache/a", "GET", ""),
    ("/unbuffered/u", "GET", ""),
    ("/unbuffered/u", "GET", ""),
    ("/nohead/h", "HEAD", ""),
    ("/nohead/h", "HEAD", ""),
    ("/nohead/h", "GET", ""),
    ("/var/v?c=one", "GET", ""),
    ("/var/v?c=one", "GET", ""),
    ("/var/v?c=nope", "GET", ""),
    ("/var/v", "GET", ""),
    ("/var/v", "GET", ""),
    ("/big?size=300000&ar=1", "GET", ""),
    ("/big?size=300000&ar=1", "GET", ""),
    ("/big?size=300000&ar=1", "GET", "Range: bytes=100000-100099\r\n"),
    ("/big?size=300000", "GET", ""),
    ("/big?size=300000", "GET", "Range: bytes=100000-100099\r\n"),
]


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_cache_statuses_match_nginx(tmp_path, app):
    conf = CONF.replace("@UP@", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got = [(s, ask(nginx_port, *s), ask(srv.port, *s)) for s in STEPS]
        diffs = [f"{s}:\n  nginx  {n}\n  gannet {g}" for s, n, g in got if n != g]
        assert not diffs, "\n".join(diffs)
        statuses = [g[1] for _, _, g in got]
        # The comparison saw the cache at work (a config both ignored would pass too).
        assert statuses[:5] == ["MISS", "HIT", "BYPASS", "HIT", "HIT"]
        assert got[3][2][2].endswith(b"count=2 lang=\n"), got[3]
        assert got[-3][2][:2] == (206, "HIT") and len(got[-3][2][2]) == 100
        assert got[-1][2][:2] == (200, "HIT")
        assert statuses[27:31] == ["MISS", "MISS", "HIT", "HIT"]
        assert b"lang=fr" in got[30][2][2]
        # What reached the application: /a twice (the miss and the bypass), /h once.
        assert app.count(str(srv.port), "/a") == 2
        assert app.count(str(srv.port), "/h") == 1
        # convert_head off: the HEAD went as HEAD, its entry apart from the GET's.
        assert app.count(str(srv.port), "/nohead/h") == 2
        # EXPIRED once the entry is out of date; HIT again after the refresh.
        ask(srv.port, "/exp?xae=1")
        ask(nginx_port, "/exp?xae=1")
        seconds_pass(2.2)
        for port in (nginx_port, srv.port):
            assert [ask(port, "/exp?xae=1")[1] for _ in range(2)] == ["EXPIRED", "HIT"]


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_revalidation_and_conditional_headers_match_nginx(tmp_path, app):
    """`proxy_cache_revalidate`: an expired entry is asked for with its ETag; the 304 makes
    it fresh again (REVALIDATED). The client's own conditional and range headers never reach
    the application of a cached location."""
    conf = CONF.replace("@UP@", str(app.port))
    path = "/reval/r?xae=1&etag=v1"
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        ports = (nginx_port, srv.port)
        for port in ports:
            assert ask(port, path, headers='If-None-Match: "v1"\r\nRange: bytes=0-1\r\n')[1] == "MISS"
            assert app.seen[(str(port), path)] == {"If-None-Match": None, "If-Modified-Since": None, "Range": None}
            # Below proxy_cache_min_uses the answer is not stored: the client's headers go.
            ask(port, "/minuses/m", headers="Range: bytes=0-1\r\n")
            assert app.seen[(str(port), "/minuses/m")]["Range"] == "bytes=0-1"
        seconds_pass(2.2)
        got = {port: [ask(port, path) for _ in range(2)] for port in ports}
        assert got[srv.port] == got[nginx_port]
        assert [a[1] for a in got[srv.port]] == ["REVALIDATED", "HIT"]
        assert got[srv.port][0][2].endswith(b"count=1 lang=\n")
        assert app.seen[(str(srv.port), path)]["If-None-Match"] == '"v1"'
        assert app.count(str(srv.port), path) == 2


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_stale_served_while_upstream_is_down(tmp_path, app):
    conf = CONF.replace("@UP@", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for port in (nginx_port, srv.port):
            assert ask(port, "/stale/s?xae=1")[1] == "MISS"
        seconds_pass(2.2)
        app.stop()
        for port in (nginx_port, srv.port):
            s, st, body = ask(port, "/stale/s?xae=1")
            assert (s, st) == (200, "STALE"), port
            assert b"count=1" in body
        # Without a cache, the same failure is a 502.
        assert ask(srv.port, "/nocache/x")[0] == 502


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_updating_serves_the_old_entry_while_one_request_refreshes_it(tmp_path, app):
    conf = CONF.replace("@UP@", str(app.port))
    path = "/stale/u?xae=1&delay=1.5"
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for port in (nginx_port, srv.port):
            assert ask(port, path)[1] == "MISS"
        seconds_pass(2.2)
        for port in (nginx_port, srv.port):
            who = str(port) if port == srv.port else str(nginx_port)
            before = app.count(who, path)
            slow = ThreadPoolExecutor(1).submit(ask, port, path)
            assert wait_until(lambda: app.count(who, path) > before)
            assert ask(port, path)[1] == "UPDATING", port
            assert slow.result()[1] == "EXPIRED"
            assert ask(port, path)[1] == "HIT"


LOCK_CONF = r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m max_size=@MAX@;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 20s;
        }
    }
}
events { worker_connections 256; }
worker_processes 1;
"""


def test_lock_makes_one_fetch_for_concurrent_misses(gannet, app):
    srv = gannet.start(conf=LOCK_CONF.replace("@UP@", str(app.port)).replace("@MAX@", "100m"))
    path = "/locked?delay=1"
    with ThreadPoolExecutor(100) as pool:
        answers = list(pool.map(lambda _: ask(srv.port, path), range(100)))
    assert app.count("", path) == 1
    assert all(a[0] == 200 and a[2].endswith(b"count=1 lang=\n") for a in answers), answers[:3]
    assert sorted({a[1] for a in answers}) == ["HIT", "MISS"]
    assert [a[1] for a in answers].count("MISS") == 1


def test_entry_survives_a_restart_and_max_size_evicts(gannet, app, tmp_path):
    conf = LOCK_CONF.replace("@UP@", str(app.port)).replace("@MAX@", "250k")
    srv = gannet.start(conf=conf)
    assert ask(srv.port, "/kept")[1] == "MISS"
    srv.stop()
    srv = gannet.start(conf=conf)
    status, st, body = ask(srv.port, "/kept")
    assert (status, st) == (200, "HIT") and body.endswith(b"count=1 lang=\n")
    assert app.count("", "/kept") == 1
    # Past the worker's copy of the entry (kept 1 s), it is looked up again: the keys zone
    # knows its file (the loader counted the folder), so it is opened, not fetched anew
    # (a lookup opens no file for a key the zone knows no entry of).
    seconds_pass(1.5)
    assert ask(srv.port, "/kept")[1] == "HIT"
    assert app.count("", "/kept") == 1
    # Entries with levels=1:2 under the cache folder: md5-named files.
    cache = Path(gannet.tmp) / "cache"

    def entries():
        return [p for p in cache.rglob("*") if p.is_file() and len(p.name) == 32]

    assert len(entries()) == 1 and len(entries()[0].parent.name) == 2
    # Four entries of 100 KB: over max_size, the least recently used go.
    for i in range(4):
        assert ask(srv.port, f"/big{i}?size=100000")[1] == "MISS"
    assert wait_until(lambda: sum(p.stat().st_size for p in entries()) <= 250 * 1024, deadline=10)
    assert ask(srv.port, "/big3?size=100000")[1] == "HIT"
    assert ask(srv.port, "/big0?size=100000")[1] == "MISS"


@pytest.mark.parametrize(
    "stmt, message",
    [
        ("proxy_cache nope;", 'zone "nope" is unknown'),
        ("proxy_cache_path /tmp/x levels=3 keys_zone=z:1m;", 'invalid "levels" "levels=3"'),
        ("proxy_cache_path /tmp/x;", "invalid number of arguments"),
        ("proxy_cache_path /tmp/x levels=1;", 'must have "keys_zone" parameter'),
        ("proxy_cache_valid 200 soon;", 'invalid time value "soon"'),
        ("proxy_cache_use_stale sometimes;", 'invalid value "sometimes"'),
        ("proxy_cache_methods PUT;", 'invalid value "PUT"'),
    ],
)
def test_bad_values_are_refused_with_the_line(gannet, stmt, message):
    r = gannet.check(http=stmt)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert "gannet.conf:" in r.stderr or "check.conf:" in r.stderr


def test_http2_clients_share_the_cache(gannet, app):
    """The HTTP/2 path runs the same cache code: a miss over HTTP/1.1 is a hit over HTTP/2,
    body and ranges from the entry file."""
    conf = LOCK_CONF.replace("@UP@", str(app.port)).replace("@MAX@", "100m").replace("listen 127.0.0.1:{port};", "listen 127.0.0.1:{port}; http2 on;")
    srv = gannet.start(conf=conf)
    path = "/h2?size=100000&ar=1"
    first = exchange(srv.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert first.headers["x-cache"] == "MISS" and len(first.body) == 100000

    def curl(*args):
        r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-D", "-", *args, f"http://127.0.0.1:{srv.port}{path}"], capture_output=True, timeout=30)
        head, _, body = r.stdout.partition(b"\r\n\r\n")
        return head.decode(), body

    head, body = curl()
    assert head.startswith("HTTP/2 200") and "x-cache: HIT" in head and body == first.body
    head, body = curl("-r", "1000-1099")
    assert head.startswith("HTTP/2 206") and body == first.body[1000:1100]
    assert app.count("", path) == 1


SWR_CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/swr levels=1:2 keys_zone=swr:1m;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:APP_PORT;
            proxy_cache swr;
            proxy_cache_background_update on;
            add_header X-Cache $upstream_cache_status always;
        }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_background_update_is_done_before_the_connection_goes_on_as_nginx(tmp_path):
    # A stale entry is answered at once (STALE) while a slow background update fetches the
    # next version; as nginx's background subrequest, the client's connection closes only
    # once the update is stored, so a request made after it is a HIT of the new version.
    import rawapps

    results = {}
    for name in ("nginx", "gannet"):
        served = []

        def behave(conn, head, body, served=served):
            served.append(head)
            if len(served) > 1:
                time.sleep(0.5)  # a slow update: what the client must not wait for
            conn.sendall(rawapps.http_answer(f"v{len(served)}\n".encode(), headers="Cache-Control: max-age=1, stale-while-revalidate=10\r\n", keep=False))

        app = rawapps.HttpApp(behave)
        try:
            (tmp_path / name).mkdir()
            with side_by_side(tmp_path / name, SWR_CONF.replace("APP_PORT", str(app.port))) as (srv, nginx_port):
                port = nginx_port if name == "nginx" else srv.port
                get = lambda: exchange(port, b"GET /p HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")  # noqa: E731
                first = get()
                time.sleep(2.1)  # the entry's max-age (whole seconds) running out: nothing signals it
                started = time.monotonic()
                stale = get()
                waited = time.monotonic() - started
                after = get()
                results[name] = [(a.headers.get("x-cache"), a.body) for a in (first, stale, after)]
                assert waited >= 0.4, f"{name}: the connection closed before the update ended"
        finally:
            app.close()
    assert results["gannet"] == results["nginx"] == [("MISS", b"v1\n"), ("STALE", b"v1\n"), ("HIT", b"v2\n")]
