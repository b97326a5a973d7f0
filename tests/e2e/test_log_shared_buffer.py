"""Access logs as nginx keeps them, side by side with Debian's nginx:

- two buffered `access_log`s to one file share one buffer, so their lines stay in the
  order they were written; they must agree on buffer, flush and gzip (nginx's "already
  defined with conflicting parameters");
- `open_log_file_cache`: a name whose file cannot be opened takes no place in the cache,
  so it does not push out a descriptor kept for a file renamed away meanwhile;
- `$uri` of a request rejected for its target is empty, not missing (`-`).
"""

from __future__ import annotations

import re
import signal

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

SHARED = PEER_MAIN + r"""
http {
    access_log off;
    log_format u $uri;
    server {
        listen 127.0.0.1:{port};
        location / {
            access_log {tmp}/shared.log u buffer=16k if=$arg_a;
            access_log {tmp}/shared.log u buffer=16k if=$arg_b;
            return 204;
        }
    }
}
"""


def test_buffered_logs_to_one_file_keep_their_order(tmp_path):
    uris = ["/one?a=1", "/two?b=1", "/three?a=1", "/none?a=0"]
    with side_by_side(tmp_path, SHARED) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            for u in uris:
                assert exchange(port, f"GET {u} HTTP/1.0\r\n\r\n".encode()).status == 204
        # The buffers are written when the servers stop (gracefully).
        srv.stop(signal.SIGQUIT)
    got = (tmp_path / "gannet" / "shared.log").read_text()
    assert got == (tmp_path / "nginx" / "shared.log").read_text()
    assert got == "/one\n/two\n/three\n"


def test_conflicting_buffers_for_one_file_are_refused(tmp_path):
    for second in ("buffer=8k", "buffer=16k flush=1s", "buffer=16k gzip"):
        http = (f"server {{ listen 127.0.0.1:1; access_log {tmp_path}/x.log combined buffer=16k; "
                f"access_log {tmp_path}/x.log combined {second}; }}")  # fmt: skip
        n, g = check_both(tmp_path, http)
        assert n.returncode != 0 and g.returncode != 0, (second, n.stderr, g.stderr)
        msg, line = re.search(r"\[emerg\] \d+#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert "conflicting parameters" in msg
        assert f":{line}: {msg}" in g.stderr or f"{msg} in" in g.stderr, (second, n.stderr, g.stderr)
    # The same parameters (another format) are fine.
    http = (f"log_format main $uri; server {{ listen 127.0.0.1:1; access_log {tmp_path}/x.log combined buffer=16k; "
            f"access_log {tmp_path}/x.log main buffer=16k; }}")  # fmt: skip
    n, g = check_both(tmp_path, http)
    assert n.returncode == 0 and g.returncode == 0, (n.stderr, g.stderr)


CACHED = PEER_MAIN + r"""
http {
    access_log off;
    log_format u $uri;
    root {root};
    server {
        listen 127.0.0.1:{port};
        location / {
            open_log_file_cache max=2 inactive=20s valid=1m min_uses=2;
            access_log {tmp}/dir/log_$arg_n u;
            return 204;
        }
    }
}
"""


def test_failed_open_keeps_cached_descriptors(tmp_path):
    with side_by_side(tmp_path, CACHED) as (srv, nginx_port):
        for side, port in (("gannet", srv.port), ("nginx", nginx_port)):
            d = tmp_path / side / "dir"
            d.mkdir()

            def get(n):
                assert exchange(port, f"GET /{n} HTTP/1.0\r\n\r\n".encode()).status == 204

            for n in ("?n=a", "?n=a", "?n=b", "?n=b"):
                get(n)
            # Both descriptors are kept (used twice); the files move away.
            d.rename(tmp_path / side / "moved")
            for n in ("?n=c", "?n=a", "?n=b"):
                get(n)
    for side in ("gannet", "nginx"):
        moved = tmp_path / side / "moved"
        assert sorted(p.name for p in moved.iterdir()) == ["log_a", "log_b"], side
        assert (moved / "log_a").read_text().count("\n") == 3, side
        assert (moved / "log_b").read_text().count("\n") == 3, side


BAD_URI = PEER_MAIN + r"""
http {
    log_format u "$uri|$request";
    server {
        listen 127.0.0.1:{port};
        access_log {tmp}/uri.log u;
        location / { return 204; }
    }
}
"""


def test_uri_of_a_rejected_request_is_empty_not_missing(tmp_path):
    # A target read but not normalised (climbing above the root, a bad escape) leaves nginx
    # an empty `$uri`; a request line that is not one leaves none ("-").
    reqs = [b"GET /ok HTTP/1.0\r\n\r\n", b"GET /../bad HTTP/1.0\r\n\r\n", b"GET /%zz HTTP/1.0\r\n\r\n",
            b"BROKEN\r\n\r\n"]  # fmt: skip
    with side_by_side(tmp_path, BAD_URI) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            for r in reqs:
                exchange(port, r)
        srv.stop(signal.SIGQUIT)
    got = (tmp_path / "gannet" / "uri.log").read_text()
    assert got == (tmp_path / "nginx" / "uri.log").read_text()
    assert got.splitlines()[:3] == ["/ok|GET /ok HTTP/1.0", "|GET /../bad HTTP/1.0", "|GET /%zz HTTP/1.0"]
