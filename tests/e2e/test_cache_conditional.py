"""Conditional requests on cached answers, as nginx: an answer served from the cache is
checked against If-None-Match / If-Modified-Since (304) and If-Unmodified-Since (412) with
its stored validators, where a plain proxied answer is passed on as the upstream made it
(200). Compared with Debian's nginx on the same config, the upstream being the same
server's static file."""

from __future__ import annotations

import pytest

from nginx_peer import PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    proxy_cache_path {tmp}/cache keys_zone=one:1m;
    # The upstream must not answer the conditions itself.
    proxy_set_header If-Modified-Since "";
    proxy_set_header If-Unmodified-Since "";
    proxy_set_header If-None-Match "";
    server {
        listen 127.0.0.1:{port};
        root {root};
        location / { }
        location /proxy/ { proxy_pass http://127.0.0.1:{port}/; }
        location /cache/ {
            proxy_pass http://127.0.0.1:{port}/;
            proxy_cache one;
            proxy_cache_valid 200 1h;
        }
    }
}
"""


def get(port: int, path: str, *lines: str):
    extra = "".join(f"{line}\r\n" for line in lines)
    return exchange(port, f"GET {path} HTTP/1.0\r\n{extra}\r\n".encode())


@pytest.fixture
def both(tmp_path):
    with side_by_side(tmp_path, CONF, {"f.txt": "cached body\n"}) as servers:
        yield servers


def test_cached_answer_meets_conditions(both):
    srv, nginx_port = both
    for port in (srv.port, nginx_port):
        first = get(port, "/cache/f.txt")
        assert first.status == 200
        lm, etag = first.headers["last-modified"], first.headers["etag"]
        old = "Fri, 05 Jul 1985 14:30:52 GMT"
        got = [
            get(port, "/cache/f.txt", f"If-None-Match: {etag}").status,
            get(port, "/cache/f.txt", f"If-Modified-Since: {lm}").status,
            get(port, "/cache/f.txt", f"If-Unmodified-Since: {old}").status,
            get(port, "/proxy/f.txt", f"If-None-Match: {etag}").status,
            get(port, "/proxy/f.txt", f"If-Unmodified-Since: {old}").status,
        ]
        assert got == [304, 304, 412, 200, 200], port
        hit = get(port, "/cache/f.txt")
        assert (hit.status, hit.headers["last-modified"], hit.headers["etag"]) == (200, lm, etag)
