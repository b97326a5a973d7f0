"""`listen ADDR:FIRST-LAST`: one listening socket per port of the range, each serving the
server (`$server_port` says which), and nginx's errors for a bad range.
"""

from __future__ import annotations

import re
import socket

import pytest

from nginx_peer import NGINX, check_both, exchange


def free_pair() -> int:
    """A port whose next one is free too."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    raise AssertionError("no two free ports in a row")


def test_port_range_listens_on_each_port(gannet):
    p = free_pair()
    srv = gannet.start(server=f'listen 127.0.0.1:{p}-{p + 1}; location / {{ return 200 "$server_port"; }}')
    for port in (p, p + 1):
        a = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (a.status, a.body) == (200, str(port).encode())
    assert srv.proc.poll() is None


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_bad_port_ranges_refused_as_nginx(tmp_path):
    for bad in ("127.0.0.1:8183-8182", "127.0.0.1:0-5", "127.0.0.1:5-70000", "127.0.0.1:5-x"):
        n, g = check_both(tmp_path, f"server {{ listen {bad}; }}")
        assert n.returncode != 0 and g.returncode != 0, (bad, n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr, (bad, n.stderr, g.stderr)
