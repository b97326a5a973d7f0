"""`proxy_store` / `proxy_store_access` (and fastcgi's, which share the code): a 200 answer
is kept as a file - at the path its URI maps to (`on`) or at a string's path - with the
access rights asked and the answer's Last-Modified as its time; other statuses and HEAD
answers are not kept, and no temp file is left. The same config runs on Debian's nginx
and the files each server made are compared."""

from __future__ import annotations

import os
import stat
from email.utils import parsedate_to_datetime

import pytest

import rawapps
from conftest import wait_until
from nginx_peer import PEER_MAIN, exchange, side_by_side

LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"


def behave(conn, head, _body):
    path = head.split(b" ")[1].decode()
    if path.startswith("/missing"):
        conn.sendall(rawapps.http_answer(b"no such thing\n", "404 Not Found", keep=False))
    else:
        extra = f"Last-Modified: {LAST_MODIFIED}\r\n"
        conn.sendall(rawapps.http_answer(f"body of {path}\n".encode(), headers=extra, keep=False))


@pytest.fixture
def apps():
    yield from rawapps.made(rawapps.HttpApp)


@pytest.fixture
def app(apps):
    return apps(behave)


CONF = PEER_MAIN + """
http {
    proxy_temp_path {tmp}/ptemp;
    server {
        listen 127.0.0.1:{port};
        location /on/ {
            root {tmp}/docs;
            proxy_pass http://127.0.0.1:APP;
            proxy_store on;
            proxy_store_access user:rw group:rw all:r;
        }
        location /str/ {
            proxy_pass http://127.0.0.1:APP;
            proxy_store {tmp}/kept/$arg_name;
        }
        location /missing/ {
            root {tmp}/docs;
            proxy_pass http://127.0.0.1:APP;
            proxy_store on;
        }
    }
}
"""


def get(port: int, path: str, method: str = "GET") -> int:
    return exchange(port, f"{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()).status


def made(tmp) -> dict:
    """What a server stored under its `tmp`: path -> (content, mode, mtime)."""
    out = {}
    for base in ("docs", "kept"):
        for dirpath, _, names in os.walk(tmp / base):
            for n in names:
                p = os.path.join(dirpath, n)
                st = os.stat(p)
                rel = os.path.relpath(p, tmp)
                out[rel] = (open(p, "rb").read(), stat.S_IMODE(st.st_mode), int(st.st_mtime))
    return out


def test_stored_files_same_as_nginx(tmp_path, app):
    conf = CONF.replace("APP", str(app.port))
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            assert get(port, "/on/deep/a.txt") == 200
            assert get(port, "/str/x?name=sub/b.txt") == 200
            assert get(port, "/missing/c.txt") == 404
            assert get(port, "/on/head.txt", "HEAD") == 200
        g, n = tmp_path / "gannet", tmp_path / "nginx"
        want = int(parsedate_to_datetime(LAST_MODIFIED).timestamp())
        assert wait_until(lambda: len(made(g)) == 2), made(g)
        ours = made(g)
        assert ours == made(n)
        assert ours["docs/on/deep/a.txt"] == (b"body of /on/deep/a.txt\n", 0o664, want)
        assert ours["kept/sub/b.txt"] == (b"body of /str/x?name=sub/b.txt\n", 0o600, want)
        # The new folders can be searched where they can be read (under the umask).
        mode = stat.S_IMODE(os.stat(g / "docs/on/deep").st_mode)
        assert mode == stat.S_IMODE(os.stat(n / "docs/on/deep").st_mode) and mode & 0o111 == 0o111
        assert os.listdir(g / "ptemp") == []


@pytest.mark.parametrize(
    "value, message",
    [
        ("proxy_store_access user:rwx;", 'invalid value "user:rwx"'),
        ("proxy_store_access owner:rw;", 'invalid value "owner:rw"'),
        ("proxy_store on; proxy_store off;", '"proxy_store" directive is duplicate'),
    ],
)
def test_bad_store_settings_are_config_errors(gannet, value, message):
    r = gannet.check(server=f"location / {{ {value} }}")
    assert r.returncode != 0
    assert message in r.stderr and "check.conf:" in r.stderr, r.stderr
