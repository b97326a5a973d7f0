"""The floor (arena/servers/floor.c, issue 30): built from source on first use, it answers the
document root's files whole over kept and closing connections (saying `Connection: close` on
those), 404 for anything else, pipelined requests in order; it is a reference row, not a web
server, and serves only cleartext static sites."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess

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


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_floor_costs_one_recv_and_one_send_a_kept_request(workdir, docroot):
    """What the row stands for, the kernel's own cost of a kept request: one recv and one send
    (and a share of an epoll_wait), no epoll_ctl (the first floor re-armed EPOLLIN after every
    answer, a third system call a request)."""
    site = Site(docroot[0], ports.free_port(), SiteOptions())
    server = SERVERS["floor"].start(site, workdir / "floor", "tuned", "0")
    n = 200
    try:
        with socket.create_connection((site.host, site.port), timeout=5) as sock:
            request = b"GET /robots.txt HTTP/1.1\r\nHost: x\r\n\r\n"
            sock.sendall(request)
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK"), answer
            trace = subprocess.Popen(["strace", "-c", "-f", "-e", "trace=recvfrom,sendto,epoll_ctl,epoll_wait",
                                      "-p", str(server.pid)], stderr=subprocess.PIPE, text=True)
            try:
                # Counted from once strace says it is attached.
                assert "attached" in trace.stderr.readline()
                for _ in range(n):
                    sock.sendall(request)
                    got = b""
                    while len(got) < len(answer):
                        got += sock.recv(65536)
                    assert got == answer
            finally:
                trace.send_signal(signal.SIGINT)  # strace prints its counts and detaches
                summary = trace.communicate(timeout=10)[1]
    finally:
        server.stop()
    calls = {m[2]: int(m[1]) for m in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$",
                                                   summary, re.M)}
    assert calls.get("recvfrom") == n and calls.get("sendto") == n, summary
    assert "epoll_ctl" not in calls, summary


def test_floor_is_a_reference_for_static_sites_only():
    floor = SERVERS["floor"]
    assert "floor" not in WEB_SERVERS and floor.reference
    assert floor.serves("static", "tuned") and not floor.serves("php", "tuned")
    with pytest.raises(ArenaError, match="floor cannot serve proxy sites"):
        floor.site_template_name("proxy", "tuned")
    assert floor.transport_support("tls") and floor.transport_support("http") is None
