"""`fastcgi_cache` and its settings with PHP-FPM, compared with Debian's nginx on one config:
a PHP script counts the requests each server sends it (in a file per `SERVER_PORT`) and
answers with the headers its query asks for; every answer's status, `$upstream_cache_status`
and body must be the same. Then the lock's single fetch for concurrent misses, which only
gannet is asked."""

from __future__ import annotations

import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side
from test_fastcgi import PHP_FPM

COUNT_PHP = r"""<?php
$f = fopen(sys_get_temp_dir() . '/' . ($_GET['tag'] ?? 'x') . '-' . $_SERVER['SERVER_PORT'] . '.count', 'c+');
flock($f, LOCK_EX);
$n = (int)stream_get_contents($f) + 1;
ftruncate($f, 0); rewind($f); fwrite($f, (string)$n);
flock($f, LOCK_UN);
if (isset($_GET['etag'])) {
    header('ETag: "' . $_GET['etag'] . '"');
    if (isset($_GET['xae']) && !isset($_GET['etag'])) header('X-Accel-Expires: ' . $_GET['xae']);
    if (($_SERVER['HTTP_IF_NONE_MATCH'] ?? '') === '"' . $_GET['etag'] . '"') { http_response_code(304); exit; }
}
if (isset($_GET['delay'])) usleep((int)($_GET['delay'] * 1000000));
if (isset($_GET['cc'])) header('Cache-Control: ' . $_GET['cc']);
if (isset($_GET['cookie'])) setcookie('a', 'b');
if (isset($_GET['xae'])) header('X-Accel-Expires: ' . $_GET['xae']);
if (isset($_GET['status'])) http_response_code((int)$_GET['status']);
echo $_SERVER['REQUEST_METHOD'] . " count=$n\n";
"""

CONF = PEER_MAIN + r"""
http {
    access_log off;
    fastcgi_cache_path {tmp}/fcache levels=2 keys_zone=php:1m;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location ~ \.php$ {
            fastcgi_pass unix:@SOCK@;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_param REQUEST_METHOD $request_method;
            fastcgi_param QUERY_STRING $query_string;
            fastcgi_param SERVER_PORT $server_port;
            fastcgi_cache php;
            fastcgi_cache_key $request_method$request_uri;
            fastcgi_cache_valid 200 10m;
            fastcgi_cache_bypass $http_x_bypass;
            fastcgi_no_cache $arg_nocache;
            fastcgi_cache_lock on;
            fastcgi_cache_lock_timeout 20s;
            fastcgi_cache_revalidate on;
        }
    }
}
"""


@pytest.fixture
def fpm(tmp_path):
    sock = tmp_path / "php.sock"
    conf = tmp_path / "php-fpm.conf"
    conf.write_text(f"""
[global]
pid = {tmp_path}/php-fpm.pid
error_log = {tmp_path}/php-fpm.log
daemonize = no
[www]
listen = {sock}
pm = static
pm.max_children = 4
catch_workers_output = no
env[TMPDIR] = {tmp_path}
php_admin_value[display_errors] = Off
""")
    proc = subprocess.Popen([PHP_FPM, "-F", "-y", str(conf), "-R"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_until(sock.exists, deadline=15):
        proc.kill()
        raise AssertionError("php-fpm did not start")
    yield sock
    proc.send_signal(signal.SIGQUIT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def ask(port: int, path: str, method: str = "GET", headers: str = "") -> tuple[int, str, bytes]:
    a = exchange(port, f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n".encode())
    return a.status, a.headers.get("x-cache", ""), a.body


STEPS = [
    ("/c.php?tag=a", "GET", ""),
    ("/c.php?tag=a", "GET", ""),
    ("/c.php?tag=a", "GET", "X-Bypass: 1\r\n"),
    ("/c.php?tag=a", "GET", ""),
    ("/c.php?tag=n&nocache=1", "GET", ""),
    ("/c.php?tag=n&nocache=1", "GET", ""),
    ("/c.php?tag=s&cc=no-store", "GET", ""),
    ("/c.php?tag=s&cc=no-store", "GET", ""),
    ("/c.php?tag=k&cookie=1", "GET", ""),
    ("/c.php?tag=k&cookie=1", "GET", ""),
    ("/c.php?tag=m&cc=max-age=60", "GET", ""),
    ("/c.php?tag=m&cc=max-age=60", "GET", ""),
    ("/c.php?tag=e&status=404", "GET", ""),
    ("/c.php?tag=e&status=404", "GET", ""),
    ("/c.php?tag=x&status=404&xae=60", "GET", ""),
    ("/c.php?tag=x&status=404&xae=60", "GET", ""),
    ("/c.php?tag=p", "POST", "Content-Length: 0\r\n"),
    ("/c.php?tag=p", "POST", "Content-Length: 0\r\n"),
]


@pytest.mark.skipif(NGINX is None or PHP_FPM is None, reason="nginx or php-fpm is not installed")
def test_fastcgi_cache_matches_nginx(tmp_path, fpm):
    conf = CONF.replace("@SOCK@", str(fpm))
    with side_by_side(tmp_path, conf, files={"c.php": COUNT_PHP}) as (srv, nginx_port):
        got = [(s, ask(nginx_port, *s), ask(srv.port, *s)) for s in STEPS]
    diffs = [f"{s}:\n  nginx  {n}\n  gannet {g}" for s, n, g in got if n != g]
    assert not diffs, "\n".join(diffs)
    statuses = [g[1] for _, _, g in got]
    assert statuses[:4] == ["MISS", "HIT", "BYPASS", "HIT"]
    assert got[3][2][2] == b"GET count=2\n"
    assert statuses[8:12] == ["MISS", "MISS", "MISS", "HIT"]
    # The entries are files named by the key's md5 in one level of two hex digits.
    files = [p for p in (tmp_path / "gannet" / "fcache").rglob("*") if p.is_file()]
    assert files and all(len(p.name) == 32 and p.parent.name == p.name[-2:] for p in files)


@pytest.mark.skipif(NGINX is None or PHP_FPM is None, reason="nginx or php-fpm is not installed")
def test_fastcgi_cache_revalidates_as_nginx(tmp_path, fpm):
    """An expired entry is asked for with its ETag (HTTP_IF_NONE_MATCH); PHP's 304 makes it
    fresh again, and the entry is served: REVALIDATED, then HIT."""
    conf = CONF.replace("@SOCK@", str(fpm))
    path = "/c.php?tag=r&etag=v1&xae=1"
    with side_by_side(tmp_path, conf, files={"c.php": COUNT_PHP}) as (srv, nginx_port):
        for port in (nginx_port, srv.port):
            assert ask(port, path)[1] == "MISS"
        until = time.time() + 2.2
        assert wait_until(lambda: time.time() >= until, deadline=8)
        got = {port: [ask(port, path) for _ in range(2)] for port in (nginx_port, srv.port)}
    assert got[srv.port] == got[nginx_port]
    assert [a[1] for a in got[srv.port]] == ["REVALIDATED", "HIT"]
    assert got[srv.port][0][2] == b"GET count=1\n"
    assert (tmp_path / f"r-{srv.port}.count").read_text() == "2"


@pytest.mark.skipif(PHP_FPM is None, reason="php-fpm is not installed")
def test_fastcgi_cache_lock_makes_one_fetch(gannet, fpm, tmp_path):
    srv = gannet.start(conf=CONF.replace("@SOCK@", str(fpm)).replace("error_log {tmp}/error.log info;", "error_log {tmp}/error.log;"), files={"c.php": COUNT_PHP})
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: ask(srv.port, "/c.php?tag=l&delay=1"), range(20)))
    assert all(a[:1] == (200,) and a[2] == b"GET count=1\n" for a in answers), answers[:3]
    assert [a[1] for a in answers].count("MISS") == 1
    assert (tmp_path / f"l-{srv.port}.count").read_text() == "1"


@pytest.mark.skipif(PHP_FPM is None, reason="php-fpm is not installed")
def test_fastcgi_cache_purge(gannet, fpm, tmp_path):
    """`fastcgi_cache_purge` (nginx Plus's): a location whose key names another's entry
    removes it (204), or every entry its prefix starts (`*`); nothing to remove is 404."""
    purge = r"""
        location /purge/ {
            fastcgi_pass unix:@SOCK@;
            fastcgi_cache php;
            fastcgi_cache_key GET/c.php?tag=$arg_tag;
            fastcgi_cache_purge $request_method;
        }
        location ~ \.php$ {"""
    conf = CONF.replace("        location ~ \\.php$ {", purge, 1).replace("@SOCK@", str(fpm))
    srv = gannet.start(conf=conf, files={"c.php": COUNT_PHP})
    for tag in ("pa", "pb", "qa"):
        assert ask(srv.port, f"/c.php?tag={tag}")[1] == "MISS"
        assert ask(srv.port, f"/c.php?tag={tag}")[1] == "HIT"
    assert ask(srv.port, "/purge/?tag=pa")[0] == 204
    assert ask(srv.port, "/c.php?tag=pa")[:3] == (200, "MISS", b"GET count=2\n")
    assert ask(srv.port, "/c.php?tag=qa")[1] == "HIT"
    assert ask(srv.port, "/purge/?tag=p*")[0] == 204
    assert [ask(srv.port, f"/c.php?tag={t}")[1] for t in ("pa", "pb", "qa")] == ["MISS", "MISS", "HIT"]
    assert ask(srv.port, "/purge/?tag=zz")[0] == 404
