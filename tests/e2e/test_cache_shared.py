"""The cache keys zone is one for every worker process (shared memory, as nginx's). gannet
runs one worker process per config (its `worker_processes` are threads), so processes
share a zone while a reload's old process drains beside the new one, and across the
respawn of a process that died: the lock makes one fetch for requests on both sides of a
reload, `proxy_cache_min_uses` keeps counting, `max_size` and a full zone are accounted
once, and the fetch of a killed process is let go. Each answer names the worker process
that sent it (`X-Pid: $pid`)."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cacheapp import CacheApp
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:@ZONE@ max_size=@MAX@;
    add_header X-Cache $upstream_cache_status always;
    add_header X-Pid $pid always;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 20s;
        }
        location /minuses/ {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
            proxy_cache_min_uses @USES@;
        }
    }
}
events { worker_connections 256; }
worker_processes 2;
error_log {tmp}/error.log;
"""


@pytest.fixture
def app():
    a = CacheApp()
    yield a
    try:
        a.stop()
    except OSError:
        pass


def conf(app, zone="1m", max_size="100m", uses=2):
    return CONF.replace("@UP@", str(app.port)).replace("@ZONE@", zone).replace("@MAX@", max_size).replace("@USES@", str(uses))


def ask(port: int, path: str) -> tuple[int, str, int, bytes]:
    """A request on its own connection: status, X-Cache, the answering worker's pid, body."""
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), timeout=30)
    return a.status, a.headers.get("x-cache", ""), int(a.headers.get("x-pid", "0")), a.body


def entries(tmp) -> list[Path]:
    return [p for p in (Path(tmp) / "cache").rglob("*") if p.is_file() and len(p.name) == 32]


def reload(srv) -> int:
    """SIGHUP; the new worker process's pid once it runs."""
    old = set(srv.worker_pids())
    srv.proc.send_signal(signal.SIGHUP)
    new = wait_until(lambda: set(srv.worker_pids()) - old, 15)
    assert new, srv.worker_pids()
    return new.pop()


def test_lock_makes_one_fetch_across_a_reload(gannet, app):
    srv = gannet.start(conf=conf(app))
    old = srv.worker_pid()
    path = "/locked?delay=3"
    with ThreadPoolExecutor(60) as pool:
        first = pool.submit(ask, srv.port, path)
        # The old process fetches; the new one's requests wait for that fetch.
        assert wait_until(lambda: app.count("", path) == 1, 10)
        new = reload(srv)
        answers = list(pool.map(lambda _: ask(srv.port, path), range(50)))
        assert first.result()[:3] == (200, "MISS", old)
    assert {a[2] for a in answers} == {new}
    assert app.count("", path) == 1
    assert all(a[0] == 200 and a[3].endswith(b"count=1 lang=\n") for a in answers), answers[:3]
    assert {a[1] for a in answers} == {"HIT"}


def test_a_reload_keeps_the_zone(gannet, app):
    srv = gannet.start(conf=conf(app, uses=3))
    old = srv.worker_pid()
    assert ask(srv.port, "/warm")[1] == "MISS"
    assert ask(srv.port, "/warm")[1] == "HIT"
    # Two uses of a min_uses 3 key before the reload; the third, after it, stores.
    assert [ask(srv.port, "/minuses/r")[1] for _ in range(2)] == ["MISS", "MISS"]
    new = reload(srv)
    assert new != old
    assert ask(srv.port, "/warm")[:3] == (200, "HIT", new)
    assert ask(srv.port, "/minuses/r")[1] == "MISS"
    assert ask(srv.port, "/minuses/r")[1] == "HIT"
    assert app.count("", "/minuses/r") == 3
    assert app.count("", "/warm") == 1


def test_a_killed_process_lets_its_fetch_go(gannet, app):
    """A worker process killed while it fetches: the master frees its fetch, so the
    respawned process's requests do not wait `proxy_cache_lock_timeout` for it; the uses
    counted before stay."""
    text = conf(app, uses=3).replace("proxy_cache_lock_timeout 20s;", "proxy_cache_lock_timeout 60s; proxy_cache_lock_age 60s;")
    srv = gannet.start(conf=text)
    old = srv.worker_pid()
    assert [ask(srv.port, "/minuses/k")[1] for _ in range(2)] == ["MISS", "MISS"]
    with ThreadPoolExecutor(1) as pool:
        pool.submit(ask, srv.port, "/slow?delay=4")
        assert wait_until(lambda: app.count("", "/slow?delay=4") == 1, 10)
        os.kill(old, signal.SIGKILL)
        new = wait_until(lambda: (p := srv.worker_pids()) and p[0] != old and p[0], 15)
        assert new
    status, cached, pid, body = ask(srv.port, "/slow?delay=4")
    assert (status, cached, pid) == (200, "MISS", new) and body.endswith(b"count=2 lang=\n")
    assert ask(srv.port, "/minuses/k")[1] == "MISS"
    assert ask(srv.port, "/minuses/k")[1] == "HIT"


def test_max_size_is_accounted_once_across_a_reload(gannet, app):
    srv = gannet.start(conf=conf(app, max_size="250k"))
    for i in range(2):
        assert ask(srv.port, f"/big{i}?size=100000")[1] == "MISS"
    new = reload(srv)
    for i in range(2, 4):
        assert ask(srv.port, f"/big{i}?size=100000")[:3] == (200, "MISS", new)
    # 400 KB stored by two processes; one manager keeps the 2 newest, which fit.
    assert wait_until(lambda: len(entries(gannet.tmp)) == 2, 10), entries(gannet.tmp)
    assert sum(p.stat().st_size for p in entries(gannet.tmp)) <= 250 * 1024
    assert ask(srv.port, "/big3?size=100000")[1] == "HIT"
    assert ask(srv.port, "/big2?size=100000")[1] == "HIT"
    assert ask(srv.port, "/big0?size=100000")[1] == "MISS"


def test_a_full_zone_forgets_the_least_recently_used(gannet, app):
    # The smallest zone, 8k: 64 keys.
    srv = gannet.start(conf=conf(app, zone="8k"))
    for i in range(100):
        assert ask(srv.port, f"/k{i}")[:2] == (200, "MISS")
    # The keys forgotten lose their files too: no more entries than the zone holds.
    assert wait_until(lambda: len(entries(gannet.tmp)) <= 64, 10), len(entries(gannet.tmp))
    assert ask(srv.port, "/k99")[1] == "HIT"
    assert ask(srv.port, "/k0")[1] == "MISS"
    assert "could not allocate node" not in srv.error_log()


def children(master: int, name: str) -> list[int]:
    """The worker processes of `master` (by their name, or nginx's process title)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmd = open(f"/proc/{entry}/cmdline", "rb").read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[1]) == master and rest[0] != "Z" and (comm == name or cmd.startswith(name.encode())):
            found.append(int(entry))
    return found


def across_a_reload(port: int, app, who: str, master: int, title: str) -> list:
    """The lock and the uses on both sides of a reload: what each step answered."""
    seen = []
    path = "/locked?delay=3"
    with ThreadPoolExecutor(20) as pool:
        first = pool.submit(ask, port, path)
        assert wait_until(lambda: app.count(who, path) == 1, 10)
        old = set(children(master, title))
        os.kill(master, signal.SIGHUP)
        assert wait_until(lambda: set(children(master, title)) - old, 15)
        answers = list(pool.map(lambda _: ask(port, path), range(10)))
        seen.append(first.result()[1])
    seen.append(sorted({(a[0], a[1], a[3]) for a in answers}))
    seen.append(app.count(who, path))
    seen.append([ask(port, "/minuses/m")[1] for _ in range(3)])
    seen.append(app.count(who, "/minuses/m"))
    return seen


@pytest.mark.skipif(NGINX is None, reason="nginx not installed")
def test_the_zone_across_a_reload_as_nginx(tmp_path, app):
    """The same steps on nginx: its keys zone (shared memory) outlives the reload too."""
    text = PEER_MAIN.replace("worker_processes 1;", "worker_processes 2;").replace("events { worker_connections 64; }", "") + conf(app).split("events {")[0].replace(
        "add_header X-Pid $pid always;", "add_header X-Pid $pid always; proxy_set_header X-Who $server_port;"
    ) + "events { worker_connections 256; }\n"
    with side_by_side(tmp_path, text) as (srv, nginx_port):
        ours = across_a_reload(srv.port, app, str(srv.port), srv.proc.pid, "gannet: worker")
        nginx_master = int((tmp_path / "nginx" / "server.pid").read_text())
        theirs = across_a_reload(nginx_port, app, str(nginx_port), nginx_master, "nginx: worker")
    assert ours == theirs
    assert ours[0] == "MISS" and ours[2] == 1


def test_a_reload_that_resizes_the_zone_makes_a_new_one(gannet, app):
    """Another size: a new zone (uses start over; the entries on disk are still found), as
    nginx; another folder for the zone: the reload is refused, as nginx's."""
    srv = gannet.start(conf=conf(app, uses=3))
    assert ask(srv.port, "/kept")[1] == "MISS"
    assert [ask(srv.port, "/minuses/s")[1] for _ in range(2)] == ["MISS", "MISS"]
    text = srv.conf_path.read_text()
    srv.conf_path.write_text(text.replace("keys_zone=one:1m", "keys_zone=one:2m"))
    reload(srv)
    assert ask(srv.port, "/kept")[1] == "HIT"
    # The third use counts as the first of the new zone: not stored.
    assert [ask(srv.port, "/minuses/s")[1] for _ in range(2)] == ["MISS", "MISS"]
    assert app.count("", "/minuses/s") == 4
    pids = srv.worker_pids()
    srv.conf_path.write_text(text.replace("{}/cache ".format(gannet.tmp), "{}/other ".format(gannet.tmp)).replace("keys_zone=one:1m", "keys_zone=one:2m"))
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "while previously it used the" in srv.error_log(), 10), srv.error_log()
    assert f'cache "one" uses the "{gannet.tmp}/other" cache path' in srv.error_log()
    assert srv.worker_pids() == pids
    assert ask(srv.port, "/kept")[1] == "HIT"
