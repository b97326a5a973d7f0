"""The floor (arena/servers/floor.c, issue 30): built from source on first use, it answers the
document root's files whole over kept and closing connections (saying `Connection: close` on
those), 404 for anything else, pipelined requests in order; it is a reference row, not a web
server, and serves only cleartext static sites."""

from __future__ import annotations

import socket

import pytest

from arena import ports, probe
from arena.errors import ArenaError
from arena.servers import SERVERS, WEB_SERVERS, Site, SiteOptions


def test_floor_answers_files_whole(workdir, docroot):
    site = Site(docroot[0], ports.free_port(), SiteOptions())
    server = SERVERS["floor"].start(site, workdir / "floor", "tuned", "0")
    try:
        for close in (False, True):
            reply = probe.get(site.host, site.port, "/img.jpg", close=close)
            assert reply.status == 200 and reply.body_bytes == docroot[1]["img.jpg"]
            assert ("\r\nConnection: close" in reply.headers) == close, reply.headers
        assert probe.get(site.host, site.port, "/missing", close=True).status == 404
        # Two pipelined requests: two answers, in order, on one connection.
        with socket.create_connection((site.host, site.port), timeout=5) as sock:
            sock.sendall(b"GET /robots.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n"
                         b"Connection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.count(b"HTTP/1.1 ") == 2
        assert data.index(b"200 OK") < data.index(b"404 Not Found")
        assert data.endswith(b"Connection: close\r\n\r\n")
    finally:
        server.stop()


def test_floor_is_a_reference_for_static_sites_only():
    floor = SERVERS["floor"]
    assert "floor" not in WEB_SERVERS and floor.reference
    assert floor.serves("static", "tuned") and not floor.serves("php", "tuned")
    with pytest.raises(ArenaError, match="floor cannot serve proxy sites"):
        floor.site_template_name("proxy", "tuned")
    assert floor.transport_support("tls") and floor.transport_support("http") is None
