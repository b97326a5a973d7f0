"""Request header lines nginx takes once only (If-Modified-Since, If-Match, Authorization,
Expect...): a repeat is a 400, on HTTP/1.x as on Debian's nginx with the same config; a
field of another name may repeat. And `$sent_http_cache_control` / `$sent_http_link` hold
every line of the answer's, joined with ", ", as nginx's."""

from __future__ import annotations

import pytest

from conftest import wait_until
from nginx_peer import PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + """
http {
    log_format sent 'cc=$sent_http_cache_control link=$sent_http_link other=$sent_http_x_other';
    server {
        listen 127.0.0.1:{port};
        location /d { return 204; }
        location /sent {
            add_header Cache-Control foo;
            add_header Cache-Control bar;
            add_header Link "<a>";
            add_header Link "<b>";
            add_header X-Other one;
            add_header X-Other two;
            access_log {tmp}/sent.log sent;
            return 200 "sent\n";
        }
    }
}
"""

UNIQUE = [
    "If-Modified-Since",
    "If-Unmodified-Since",
    "If-Match",
    "If-None-Match",
    "Content-Range",
    "If-Range",
    "Expect",
    "Authorization",
]


def get(port: int, path: str, *lines: str):
    extra = "".join(f"{line}\r\n" for line in lines)
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{extra}\r\n".encode())


@pytest.fixture
def both(tmp_path):
    with side_by_side(tmp_path, CONF) as servers:
        yield servers


@pytest.mark.parametrize("name", UNIQUE)
def test_repeated_unique_header_is_a_bad_request(both, name):
    srv, nginx_port = both
    for port in (srv.port, nginx_port):
        assert get(port, "/d", f"{name}: foo").status == 204, port
        assert get(port, "/d", f"{name}: foo", f"{name.upper()}: bar").status == 400, port
    # Other names may repeat.
    assert get(srv.port, "/d", "X-Foo: a", "X-Foo: b").status == 204


def test_sent_cache_control_and_link_are_joined(both, tmp_path):
    srv, nginx_port = both
    assert get(srv.port, "/sent").status == get(nginx_port, "/sent").status == 200
    logs = [tmp_path / side / "sent.log" for side in ("gannet", "nginx")]
    assert wait_until(lambda: all(p.exists() and p.read_text() for p in logs))
    assert [p.read_text() for p in logs] == ["cc=foo, bar link=<a>, <b> other=one\n"] * 2
