"""`debug_connection` (events): requests from the clients it names are logged at the debug
level to every error log of their context, whatever its level; other clients' are not.
Checked against Debian's nginx (built with debug) on the same config. A log at `debug`
gets a request's debug lines whoever the client."""

from __future__ import annotations

import pytest

from conftest import wait_until
from nginx_peer import exchange, side_by_side

CONF = """
user root;
worker_processes 1;
pid {tmp}/server.pid;
error_log {tmp}/error.log alert;
events { worker_connections 64; debug_connection NET; }
http {
    error_log {tmp}/one.log alert;
    error_log {tmp}/two.log crit;
    server {
        listen 127.0.0.1:{port};
        location / { return 200 "ok\\n"; }
    }
}
"""


def get(port: int) -> int:
    return exchange(port, b"GET /x?a=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").status


@pytest.mark.parametrize("net, debugged", [("127.0.0.1", True), ("127.0.0.0/8", True), ("10.0.0.0/8", False), ("::1", False)])
def test_debug_connection_as_nginx(tmp_path, net, debugged):
    with side_by_side(tmp_path, CONF.replace("NET", net)) as (srv, nginx_port):
        for port, side in ((srv.port, "gannet"), (nginx_port, "nginx")):
            assert get(port) == 200
            logs = [tmp_path / side / name for name in ("one.log", "two.log")]
            if debugged:
                assert wait_until(lambda: all(p.exists() and "[debug]" in p.read_text() for p in logs)), side
            else:
                assert get(port) == 200  # the first request's lines are written by now
                assert not any(p.exists() and "[debug]" in p.read_text() for p in logs), side
        if debugged:
            text = (tmp_path / "gannet" / "one.log").read_text()
            assert 'http request line: "GET /x?a=1 HTTP/1.1"' in text
            assert 'http args: "a=1"' in text


def test_bad_debug_connection(gannet):
    r = gannet.check(conf="events { debug_connection no.such.host.invalid; }\nhttp { }\n")
    assert r.returncode != 0
    assert 'host not found in debug_connection "no.such.host.invalid"' in r.stderr
    assert "check.conf:1" in r.stderr
