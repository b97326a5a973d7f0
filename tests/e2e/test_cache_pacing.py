"""The pace of the cache's loader and manager (`proxy_cache_path`'s `loader_files`,
`loader_sleep`, `loader_threshold`, `manager_files`, `manager_sleep`, `manager_threshold`):
a round handles at most `*_files` entries, then the next waits `*_sleep`. Shown with a
sleep of an hour, so that what one round did stays as it is while the test looks: after a
restart with six entries on disk, a loader of two files a round has counted two (and the
others are still served: a lookup opens the file of a key the loader has not come to yet);
a manager of two files a round, with six entries over `max_size`, has removed two. With a
threshold of 0 each round handles one entry (at least one a round, as nginx's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cacheapp import CacheApp
from conftest import wait_until
from nginx_peer import PEER_MAIN, exchange

CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path {tmp}/cache levels=1:2 keys_zone=one:1m @MORE@;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location = /metrics { metrics; }
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
        }
    }
}
"""


def ask(port: int, path: str) -> tuple[int, str]:
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), timeout=30)
    return a.status, a.headers.get("x-cache", "")


def entries_counted(port: int) -> int:
    a = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    m = re.search(r'^gannet_cache_entries\{zone="one"\} (\S+)$', a.body.decode(), re.M)
    return int(float(m.group(1))) if m else -1


def entry_files(tmp: Path) -> list[Path]:
    return [p for p in (tmp / "cache").rglob("*") if p.is_file() and len(p.name) == 32]


def six_entries(gannet, app) -> None:
    srv = gannet.start(conf=CONF.replace("@UP@", str(app.port)).replace("@MORE@", ""))
    for i in range(6):
        assert ask(srv.port, f"/e{i}?size=10000") == (200, "MISS")
    assert wait_until(lambda: len(entry_files(gannet.tmp)) == 6)
    srv.stop()


@pytest.mark.parametrize("pace, counted", [("loader_files=2", 2), ("loader_threshold=0", 1)])
def test_the_loader_counts_loader_files_entries_a_round(gannet, pace, counted):
    app = CacheApp()
    try:
        six_entries(gannet, app)
        conf = CONF.replace("@UP@", str(app.port)).replace("@MORE@", f"{pace} loader_sleep=1h")
        srv = gannet.start(conf=conf)
        assert wait_until(lambda: entries_counted(srv.port) >= counted)
        assert entries_counted(srv.port) == counted
        # Not counted yet, still on disk: served from its file.
        assert [ask(srv.port, f"/e{i}?size=10000") for i in range(6)] == [(200, "HIT")] * 6
        assert all(app.count("", f"/e{i}?size=10000") == 1 for i in range(6))
    finally:
        app.stop()


@pytest.mark.parametrize("pace, left", [("manager_files=2", 4), ("manager_threshold=0", 5)])
def test_the_manager_removes_manager_files_entries_a_round(gannet, pace, left):
    app = CacheApp()
    try:
        six_entries(gannet, app)
        # Room for one entry: the manager's first round, after the loader's, removes what
        # its pace allows, and the next is an hour away.
        more = f"max_size=12k {pace} manager_sleep=1h"
        srv = gannet.start(conf=CONF.replace("@UP@", str(app.port)).replace("@MORE@", more))
        # The metrics page starts the manager (else the first lookup does).
        entries_counted(srv.port)
        assert wait_until(lambda: len(entry_files(gannet.tmp)) <= left)
        assert len(entry_files(gannet.tmp)) == left
        assert entries_counted(srv.port) == left
    finally:
        app.stop()
