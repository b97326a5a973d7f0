"""empty_gif: the 43-byte transparent GIF as nginx's (GET/HEAD, 405 otherwise, a fixed
Last-Modified so If-Modified-Since gets 304, not inherited by a nested location); side by
side with Debian's nginx."""

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /pixel { empty_gif; location /pixel/file { } }
    }
}
"""

FILES = {"pixel/file": "F\n"}

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed")


def ask(port, method, path, extra=""):
    return exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())


def test_empty_gif_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        answers = {}
        for port in (srv.port, nginx_port):
            get = ask(port, "GET", "/pixel?x=1")
            assert get.status == 200 and get.headers["content-type"] == "image/gif", get
            assert get.body[:6] == b"GIF89a" and len(get.body) == 43 and get.body[-1:] == b";"
            assert get.headers["last-modified"] == "Mon, 28 Sep 1970 06:00:00 GMT"
            head = ask(port, "HEAD", "/pixel")
            assert head.status == 200 and head.body == b"" and head.headers["content-length"] == "43"
            post = ask(port, "POST", "/pixel", "Content-Length: 2\r\n\r\nab")
            assert post.status == 405, post
            cond = ask(port, "GET", "/pixel", "If-Modified-Since: Mon, 28 Sep 1970 06:00:00 GMT\r\n")
            assert cond.status == 304 and cond.body == b"", cond
            nested = ask(port, "GET", "/pixel/file")
            assert nested.status == 200 and nested.body == b"F\n", nested
            answers[port] = get.body
        assert answers[srv.port] == answers[nginx_port]


def test_empty_gif_config(tmp_path):
    for http in ("server { listen 127.0.0.1:2; location / { empty_gif on; } }",
                 "server { listen 127.0.0.1:2; empty_gif; }"):
        n, g = check_both(tmp_path, http)
        assert n.returncode != 0 and g.returncode != 0, (n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr, (n.stderr, g.stderr)
