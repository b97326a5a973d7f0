"""`access_log ... gzip[=level]` on gannet and Debian's nginx with one config: the file is
gzip members (one per buffer written) that decompress to the same lines; and nginx's
errors for the buffer, flush and gzip parameters.
"""

from __future__ import annotations

import gzip
import re
import signal

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format u "$request_method $uri $status";
    server {
        listen 127.0.0.1:{port};
        access_log {tmp}/z.log u gzip=9 buffer=64 flush=100ms;
        access_log {tmp}/d.log u gzip;
        location / { return 200 "ok"; }
    }
}
"""


def lines(path) -> bytes:
    try:
        return gzip.decompress(path.read_bytes())
    except (OSError, EOFError):
        return b""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_gzip_log_as_nginx(tmp_path):
    paths = [f"/p{i}/{'x' * 20}" for i in range(6)]
    want_text = b"".join(f"GET {p} 200\n".encode() for p in paths)
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            for p in paths:
                exchange(port, f"GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        for side in ("gannet", "nginx"):
            z = tmp_path / side / "z.log"
            # 64 bytes of buffer: flushed when full and by the 100ms flush timer.
            assert wait_until(lambda: lines(z) == want_text), (side, z.read_bytes())
            raw = z.read_bytes()
            assert raw[:2] == b"\x1f\x8b" and raw.count(b"\x1f\x8b\x08") >= 2, (side, raw[:40])
        # Without flush= the 64k buffer is written when the server stops (gracefully:
        # gannet's workers die at once on SIGTERM, with what they had not written yet).
        srv.stop(signal.SIGQUIT)
    for side in ("gannet", "nginx"):
        assert lines(tmp_path / side / "d.log") == want_text, side


def test_gzip_log_parameters_checked_as_nginx(tmp_path):
    for bad in ("gzip=0", "gzip=10", "gzip=x", "buffer=0", "flush=0", "flush=1s", "gzipp"):
        http = f"server {{ listen 127.0.0.1:1; access_log {tmp_path}/x.log combined {bad}; }}"
        n, g = check_both(tmp_path, http)
        assert n.returncode != 0 and g.returncode != 0, (bad, n.stderr, g.stderr)
        msg, line = re.search(r"#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr or f"{msg} in" in g.stderr, (bad, n.stderr, g.stderr)
