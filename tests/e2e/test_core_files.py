"""ngx_http_core_module directives about how files and answers go out, against Debian's nginx:
`max_ranges` (0: no ranges and no Accept-Ranges; more ranges than N: the whole file, 200),
`chunked_transfer_encoding off` (an HTTP/1.1 answer of unknown length is close-delimited)
and `disable_symlinks` (403 on a link, with `from=` leaving a prefix unchecked, and
`if_not_owner` allowing a link whose owner is its target's).
"""

from __future__ import annotations

import os

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side
from rawapps import HttpApp

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

BODY = bytes(range(256)) * 4
LONG = b"no length here\n" * 40000


def get(port: int, path: str, extra: str = "", version: str = "1.1"):
    return exchange(port, f"GET {path} HTTP/{version}\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode())


def same(g, n, headers=("content-type", "content-length", "content-range", "accept-ranges", "transfer-encoding", "connection")):
    assert g.status == n.status
    if "multipart" in g.headers.get("content-type", ""):
        headers = [h for h in headers if h not in ("content-type", "content-length")]
    for h in headers:
        assert g.headers.get(h) == n.headers.get(h), h
    # multipart boundaries differ by server: compare the bodies without them.
    if "multipart" not in g.headers.get("content-type", ""):
        assert g.body.replace(b"gannet/0.1.0", b"nginx/1.22.1") == n.body


RANGES_CONF = PEER_MAIN + r"""
http {
    default_type application/octet-stream;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /none/ { max_ranges 0; }
        location /two/ { max_ranges 2; }
    }
}
"""


@pytest.mark.parametrize("path,rng,status", [
    ("/none/f", "bytes=0-9", 200),
    ("/two/f", "bytes=0-9", 206),
    ("/two/f", "bytes=0-9,20-29", 206),
    ("/two/f", "bytes=0-9,20-29,40-49", 200),
    ("/f", "bytes=0-9,20-29,40-49", 206),
])
def test_max_ranges_as_nginx(tmp_path, path, rng, status):
    files = {"f": BODY, "none/f": BODY, "two/f": BODY}
    with side_by_side(tmp_path, RANGES_CONF, files) as (srv, nginx_port):
        g, n = get(srv.port, path, f"Range: {rng}\r\n"), get(nginx_port, path, f"Range: {rng}\r\n")
        same(g, n)
        assert g.status == status
        if status == 200:
            assert g.body == BODY
        # max_ranges 0 offers no ranges at all.
        if path == "/none/f":
            assert "accept-ranges" not in g.headers


@pytest.fixture
def unknown_length():
    """An upstream answering without a length, ending its answer by closing; large enough
    that it is passed on as it comes rather than gathered."""

    def answer(conn, head, body):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + LONG)

    app = HttpApp(answer)
    yield app
    app.close()


@pytest.mark.parametrize("setting", ["on", "off"])
def test_chunked_transfer_encoding_as_nginx(tmp_path, unknown_length, setting):
    conf = PEER_MAIN + f"""
http {{
    chunked_transfer_encoding {setting};
    server {{
        listen 127.0.0.1:{{port}};
        location / {{ proxy_pass http://127.0.0.1:{unknown_length.port}; }}
    }}
}}
"""
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        g, n = get(srv.port, "/"), get(nginx_port, "/")
        same(g, n)
        assert g.body == LONG
        assert ("transfer-encoding" in g.headers) == (setting == "on")
        if setting == "off":
            assert g.headers.get("connection") == "close"


SYMLINK_CONF = PEER_MAIN + r"""
http {
    default_type text/plain;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /on/ { disable_symlinks on; }
        location /from/ { disable_symlinks on from=$document_root; }
        location /owner/ { disable_symlinks if_not_owner; }
        location /ifon/ {
            disable_symlinks on;
            if (-f $request_filename) { return 204; }
        }
        # A file named as a folder (a trailing `/`): no such folder.
        location ~ ^(/owner/.+/)tail$ { disable_symlinks if_not_owner; alias {root}$1; }
    }
}
"""


def make_links(root):
    for d in ("on", "from", "owner", "plain", "ifon"):
        (root / d).mkdir(exist_ok=True)
        (root / d / "real.txt").write_text(f"real {d}\n")
        os.symlink(root / d / "real.txt", root / d / "link.txt")
    # A link to a file owned by someone else: if_not_owner refuses it.
    other = root / "owner" / "other.txt"
    other.write_text("other\n")
    os.chown(other, 65534, 65534)
    os.symlink(other, root / "owner" / "otherlink.txt")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_disable_symlinks_as_nginx(tmp_path):
    with side_by_side(tmp_path, SYMLINK_CONF) as (srv, nginx_port):
        for root in (tmp_path / "gannet" / "www",):
            make_links(root)
        cases = {
            "/on/real.txt": 200, "/on/link.txt": 403,
            # The root itself may be reached through links; past it, none.
            "/from/real.txt": 200, "/from/link.txt": 403,
            "/owner/link.txt": 200, "/owner/otherlink.txt": 403,
            "/plain/link.txt": 200,
            # `if (-f ...)` opens the file with the location's check: a link is no file.
            "/ifon/real.txt": 204, "/ifon/link.txt": 403,
            "/owner/real.txt/tail": 404,
        }
        for path, status in cases.items():
            g, n = get(srv.port, path), get(nginx_port, path)
            same(g, n, headers=("content-type", "content-length"))
            assert g.status == status, path
        msg = f'openat() "{tmp_path}/gannet/www/on/link.txt" failed (40: Too many levels of symbolic links)'
        wait_until(lambda: msg in srv.error_log())
        assert msg.replace("/gannet/", "/gannet/") in (tmp_path / "nginx" / "error.log").read_text()
