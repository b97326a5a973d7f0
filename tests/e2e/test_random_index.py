"""random_index: a random regular file of the directory (hidden names and directories
left out, links followed), arguments kept, the rest left to `index`; side by side with
Debian's nginx."""

import os
import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /r/ { random_index on; }
        location /e/ { random_index on; }
        location /gone/ { random_index on; }
        location /off/ { random_index off; }
        location ~ [.]txt$ { add_header X-Args "[$args] [$uri]"; }
    }
}
"""

FILES = {"r/a.txt": "A\n", "r/b.txt": "B\n", "r/.hidden.txt": "H\n", "r/sub/x.txt": "X\n",
         "e/sub/x.txt": "X\n", "off/a.txt": "A\n", "off/index.html": "I\n", "target.txt": "L\n"}

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed")


def get(port, path):
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())


def test_random_index_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        os.symlink(srv.tmp / "www" / "target.txt", srv.tmp / "www" / "r" / "link.txt")
        for port in (srv.port, nginx_port):
            seen = set()
            for _ in range(60):
                a = get(port, "/r/?k=v")
                assert a.status == 200, a
                seen.add((a.body, a.headers.get("x-args")))
            # Every regular file, none of the others, each through a redirect keeping ?k=v.
            assert seen == {(b"A\n", "[k=v] [/r/a.txt]"), (b"B\n", "[k=v] [/r/b.txt]"),
                            (b"L\n", "[k=v] [/r/link.txt]")}, seen
        for path in ("/e/", "/gone/", "/off/", "/r/a.txt"):
            g, n = get(srv.port, path), get(nginx_port, path)
            assert g.status == n.status and (g.status != 200 or g.body == n.body), (path, g, n)
        assert get(srv.port, "/gone/").status == 404
        assert get(srv.port, "/e/").status == 403
        assert 'opendir() "' in srv.error_log() and "/gone\" failed (2: No such file or directory)" in srv.error_log()


def test_random_index_config(tmp_path):
    for http in ("random_index on;", "server { listen 127.0.0.1:2; location / { random_index maybe; } }"):
        n, g = check_both(tmp_path, http)
        assert n.returncode != 0 and g.returncode != 0, (n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr, (n.stderr, g.stderr)
