"""The cache and its file systems, each an ext4 of its own, loop-mounted.

- A miss's answer goes to the client before its entry is written, as nginx sends an answer
  before it renames the entry's temp file: the client does not wait for the cache's file
  system. Shown with it frozen (`fsfreeze`: every write to it waits until it is thawed):
  the answer still comes; once thawed, the entry is in place for the connection's next
  request (HIT), and the application was asked once.
- `min_free`: when the cache's file system has less free space than that, the manager
  removes the least recently used entries until it has it again (nginx's manager).
- With the temp folder on another file system than the cache (`use_temp_path=on`, the
  default), where a rename fails (EXDEV), an entry is copied into place, as nginx's
  `ngx_ext_rename_file` does; no temp file is left behind.
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess

import pytest

from cacheapp import CacheApp
from conftest import wait_until
from nginx_peer import PEER_MAIN

CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cache_path @CACHE@ levels=1:2 keys_zone=one:1m use_temp_path=@TEMP@ @MORE@;
    add_header X-Cache $upstream_cache_status always;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:@UP@;
            proxy_cache one;
            proxy_cache_valid 200 10m;
        }
    }
}
"""

TOOLS = ("fsfreeze", "mkfs.ext4", "mount", "umount")


@pytest.fixture
def own_fs(tmp_path):
    """A small ext4 file system of its own, loop-mounted (thawed and unmounted after)."""
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True, capture_output=True)
    yield mnt
    subprocess.run(["fsfreeze", "-u", str(mnt)], capture_output=True)
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


NEEDS = pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS),
                           reason="needs root (a loop mount) and fsfreeze")


@NEEDS
def test_a_miss_is_answered_while_the_cache_cannot_be_written(gannet, own_fs):
    frozen_fs = own_fs
    app = CacheApp()
    try:
        conf = CONF.replace("@UP@", str(app.port)).replace("@CACHE@", str(frozen_fs / "cache")).replace("@TEMP@", "off").replace("@MORE@", "")
        srv = gannet.start(conf=conf)
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("GET", "/first")
        r = c.getresponse()
        assert (r.status, r.getheader("X-Cache"), r.read()) == (200, "MISS", b"/first GET count=1 lang=\n")
        subprocess.run(["fsfreeze", "-f", str(frozen_fs)], check=True)
        try:
            # The answer is read by its length on a kept connection: it must come while the
            # entry's write waits for the thaw (a timeout here fails the test).
            c.request("GET", "/frozen")
            r = c.getresponse()
            assert (r.status, r.getheader("X-Cache"), r.read()) == (200, "MISS", b"/frozen GET count=1 lang=\n")
        finally:
            subprocess.run(["fsfreeze", "-u", str(frozen_fs)], check=True)
        c.request("GET", "/frozen")
        r = c.getresponse()
        assert (r.status, r.getheader("X-Cache"), r.read()) == (200, "HIT", b"/frozen GET count=1 lang=\n"), srv.error_log()
        assert app.count("", "/frozen") == 1
        c.close()
    finally:
        app.stop()


@NEEDS
def test_entries_are_copied_from_a_temp_folder_on_another_file_system(gannet, own_fs):
    app = CacheApp()
    try:
        conf = CONF.replace("@UP@", str(app.port)).replace("@CACHE@", str(own_fs / "cache")).replace("@TEMP@", "on").replace("@MORE@", "")
        srv = gannet.start(conf=conf)
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        for path, size in (("/small", 100), ("/big", 300_000)):
            for want in ("MISS", "HIT"):
                c.request("GET", f"{path}?size={size}")
                r = c.getresponse()
                assert (r.status, r.getheader("X-Cache"), len(r.read())) == (200, want, size), srv.error_log()
            assert app.count("", f"{path}?size={size}") == 1
        c.close()
        entries = [p for p in (own_fs / "cache").rglob("*") if p.is_file()]
        assert len(entries) == 2 and all(len(p.name) == 32 for p in entries), entries
        temp = srv.tmp / "proxy_temp"
        assert not [p for p in temp.rglob("*") if p.is_file()]
        assert "failed" not in srv.error_log()
    finally:
        app.stop()


def free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@NEEDS
def test_min_free_removes_the_least_recently_used_entries(gannet, own_fs):
    app = CacheApp()
    try:
        # Room for about three entries of 1 MB before the file system is short.
        min_free = free(own_fs) - 3_500_000
        conf = (CONF.replace("@UP@", str(app.port)).replace("@CACHE@", str(own_fs / "cache"))
                .replace("@TEMP@", "off").replace("@MORE@", f"min_free={min_free}"))
        srv = gannet.start(conf=conf)
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)

        def get(path):
            c.request("GET", f"{path}?size=1000000")
            r = c.getresponse()
            assert (r.status, len(r.read())) == (200, 1_000_000), srv.error_log()
            return r.getheader("X-Cache")

        for i in range(6):
            assert get(f"/e{i}") == "MISS"
        assert free(own_fs) < min_free
        assert wait_until(lambda: free(own_fs) >= min_free, deadline=15), (free(own_fs), min_free)
        # The most recent stay, the oldest went.
        assert get("/e5") == "HIT"
        assert get("/e0") == "MISS"
        assert app.count("", "/e0?size=1000000") == 2
        c.close()
    finally:
        app.stop()
