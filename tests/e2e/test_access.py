"""Access by client address: `allow` / `deny` (first match wins, 403, a level with rules of
its own replacing the outer level's) and `limit_except` (the methods it does not list get
its block's settings). The client is 127.0.0.1 (or ::1), so the rules are written around
it. The same config runs on Debian's nginx, and every answer must be the same.
"""

from __future__ import annotations

import re
import socket

import pytest

from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side
from test_differential import normalise


CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    allow 10.0.0.0/8;
    deny all;

    server {
        listen 127.0.0.1:{port} default_server;
        server_name main.test;
        location /inherit/ { }
        location /open/ { allow all; }
        location /self/ { allow 127.0.0.1; deny all; }
        location /net/ { deny 10.0.0.0/8; allow 127.0.0.0/8; deny all; }
        location /mask/ { allow 127.0.0.5/8; deny all; }
        location /v6only/ { allow ::1; allow ::/0; deny all; }
        location /unix/ { allow unix:; deny all; }
        location /first/ { deny 127.0.0.1; allow all; }
        location /ret/ { return 200 "return comes before access\n"; }
        location /nested/ {
            allow all;
            location /nested/deny/ { deny all; }
            location /nested/inherit/ { }
        }
        location /ep/ { allow all; error_page 404 /denied.html; }
        location = /denied.html { }
        location = /page.html { allow all; }

        location /le/ { allow all; limit_except GET { deny all; } }
        location /le2/ { allow all; limit_except get POST { deny 127.0.0.1; allow all; } }
        location /le3/ { allow all; limit_except PUT { deny all; } }
        location /le-ret/ { allow all; return 200 "location return\n"; limit_except GET { allow all; } }
        location /le-deny/ { deny all; limit_except GET { allow all; } }
        location /le-nest/ { allow all; limit_except GET { deny all; } location /le-nest/in/ { } }
        location /le-ep/ { allow all; error_page 403 /page.html; limit_except GET { deny all; } }
        location /le-hdr/ { allow all; add_header X-Test yes always; limit_except GET { deny all; } }
    }

    server {
        listen 127.0.0.1:{port};
        server_name srv.test;
        allow 127.0.0.1;
        location / { }
        location /loc/ { deny all; }
    }
}
"""

FILES = {
    "page.html": "<p>the page</p>\n",
    "denied.html": "<p>never shown</p>\n",
    "f.txt": "top\n",
    **{f"{d}/f.txt": f"{d}\n" for d in (
        "inherit", "open", "self", "net", "mask", "v6only", "unix", "first", "ret", "nested",
        "nested/deny", "nested/inherit", "le", "le2", "le3", "le-ret", "le-deny", "le-nest",
        "le-nest/in", "le-ep", "le-hdr", "loc")},
}

PATHS = ["/inherit/f.txt", "/open/f.txt", "/self/f.txt", "/net/f.txt", "/mask/f.txt",
         "/v6only/f.txt", "/unix/f.txt", "/first/f.txt", "/ret/f.txt", "/nested/f.txt",
         "/nested/deny/f.txt", "/nested/inherit/f.txt", "/ep/missing", "/le/f.txt", "/le/",
         "/le2/f.txt", "/le3/f.txt", "/le-ret/f.txt", "/le-deny/f.txt", "/le-nest/f.txt",
         "/le-nest/in/f.txt", "/le-ep/f.txt", "/le-hdr/f.txt"]  # fmt: skip
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "FOO"]


def request(method: str, path: str, host: str = "main.test") -> bytes:
    body = b"Content-Length: 4\r\n\r\nbody" if method in ("POST", "PUT", "PATCH") else b"\r\n"
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n".encode() + body


SENT = [request(m, p) for p in PATHS for m in METHODS] + [
    request(m, p, "srv.test") for p in ("/f.txt", "/loc/f.txt") for m in ("GET", "POST")
]


@pytest.fixture
def served(gannet):
    return gannet.start(conf=CONF, files=FILES)


def status(srv, method: str, path: str, host: str = "main.test") -> int:
    return exchange(srv.port, request(method, path, host)).status


def test_first_matching_rule_decides(served):
    assert status(served, "GET", "/inherit/f.txt") == 403  # http's `deny all`
    assert status(served, "GET", "/open/f.txt") == 200  # its own rules replace http's
    assert status(served, "GET", "/self/f.txt") == 200
    assert status(served, "GET", "/net/f.txt") == 200  # 10/8 does not match, 127/8 does
    assert status(served, "GET", "/mask/f.txt") == 200  # host bits beyond /8 are dropped
    assert status(served, "GET", "/v6only/f.txt") == 403  # IPv6 rules never match IPv4
    assert status(served, "GET", "/unix/f.txt") == 403
    assert status(served, "GET", "/first/f.txt") == 403  # deny before allow all
    assert status(served, "GET", "/nested/f.txt") == 200
    assert status(served, "GET", "/nested/deny/f.txt") == 403
    assert status(served, "GET", "/nested/inherit/f.txt") == 200  # from /nested/, not http
    assert status(served, "GET", "/f.txt", "srv.test") == 200  # server rules replace http's
    assert status(served, "GET", "/loc/f.txt", "srv.test") == 403
    a = exchange(served.port, request("GET", "/inherit/f.txt"))
    assert b"<title>403 Forbidden</title>" in a.body
    assert "access forbidden by rule" in served.error_log()


def test_return_runs_before_access_and_error_pages_are_checked_too(served):
    # The rewrite phase comes first: `return` answers even where everyone is denied.
    a = exchange(served.port, request("GET", "/ret/f.txt"))
    assert (a.status, a.body) == (200, b"return comes before access\n")
    # The error page's own location denies: the built-in 403 page, not the file.
    a = exchange(served.port, request("GET", "/ep/missing"))
    assert a.status == 403 and b"never shown" not in a.body


def test_limit_except(served):
    for method in ("GET", "HEAD"):
        assert status(served, method, "/le/f.txt") == 200
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "FOO"):
        assert status(served, method, "/le/f.txt") == 403, method
    # Methods are named in any case; GET brings HEAD; the listed ones keep the
    # location's rules (POST: on to the static handler, 405), the others get the block's.
    assert [status(served, m, "/le2/f.txt") for m in ("GET", "HEAD", "POST", "PUT")] == [200, 200, 405, 403]
    assert [status(served, m, "/le3/f.txt") for m in ("GET", "HEAD", "PUT")] == [403, 403, 405]
    # A limited method does not run the location's `return` (nginx's rewrite statements
    # are not part of the block).
    a = exchange(served.port, request("GET", "/le-ret/f.txt"))
    assert (a.status, a.body) == (200, b"location return\n")
    assert status(served, "POST", "/le-ret/f.txt") == 405
    # The location's rules apply to the listed methods, the block's to the others.
    assert status(served, "GET", "/le-deny/f.txt") == 403
    assert status(served, "DELETE", "/le-deny/f.txt") == 405
    # Not inherited by a nested location.
    assert status(served, "POST", "/le-nest/f.txt") == 403
    assert status(served, "POST", "/le-nest/in/f.txt") == 405
    # The block inherits the location's error_page and add_header.
    a = exchange(served.port, request("POST", "/le-ep/f.txt"))
    assert (a.status, a.body) == (403, b"<p>the page</p>\n")
    a = exchange(served.port, request("POST", "/le-hdr/f.txt"))
    assert a.status == 403 and a.headers.get("x-test") == "yes"


def test_ipv6_clients(gannet):
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = free_port()
    gannet.start(conf=f"""
worker_processes 1;
pid {{tmp}}/gannet.pid;
error_log {{tmp}}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log off;
    root {{root}};
    server {{
        listen 127.0.0.1:{port};
        listen [::1]:{port};
        location /a/ {{ allow ::1; deny all; return 200 "a\\n"; }}
        location /b/ {{ deny 0::1/128; allow all; }}
        location /c/ {{ allow 2001:db8::/32; allow 127.0.0.1; deny all; }}
        location /d/ {{ deny ::/0; allow 127.0.0.1; }}
    }}
}}""", port=port, files={"a/f": "a\n", "b/f": "b\n", "c/f": "c\n", "d/f": "d\n"})

    def get(host: str, path: str) -> int:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            return int(s.recv(100).split()[1])

    assert [get("::1", p) for p in ("/a/f", "/b/f", "/c/f", "/d/f")] == [200, 403, 403, 403]
    assert [get("127.0.0.1", p) for p in ("/a/f", "/b/f", "/c/f", "/d/f")] == [200, 200, 200, 200]


def config_error(gannet, body: str) -> str:
    r = gannet.check(server=body)
    assert r.returncode != 0, r.stderr
    return r.stderr


@pytest.mark.parametrize("body, message", [
    ("allow 10.0.0.256;", 'invalid parameter "10.0.0.256"'),
    ("deny 10.1/8;", 'invalid parameter "10.1/8"'),
    ("deny 10.0.0.0/33;", 'invalid parameter "10.0.0.0/33"'),
    ("deny ::1/129;", 'invalid parameter "::1/129"'),
    ("deny ALL;", 'invalid parameter "ALL"'),
    ("allow unix:/x;", 'invalid parameter "unix:/x"'),
    ("allow all all;", 'invalid number of arguments in "allow" directive'),
    ("location / { limit_except GET FOO { deny all; } }", 'invalid method "FOO"'),
    ("location / { limit_except TRACE { deny all; } }", 'invalid method "TRACE"'),
    ("location / { limit_except GET { deny all; } limit_except POST { deny all; } }",
     '"limit_except" directive is duplicate'),
    ("location / { limit_except GET { root /x; } }", '"root" directive is not allowed here'),
    ("location / { limit_except GET; }", 'directive "limit_except" has no opening "{"'),
    ("location / { limit_except { deny all; } }", 'invalid number of arguments in "limit_except" directive'),
    ("limit_except GET { deny all; }", '"limit_except" directive is not allowed here'),
    ("location / { if ($uri) { limit_except GET { deny all; } } }", '"limit_except" directive is not allowed here'),
    ("location / { if ($uri) { deny all; } }", '"deny" directive is not allowed here'),
    ("location / { limit_except GET { proxy_pass http://127.0.0.1:1/x; } }",
     '"proxy_pass" cannot have URI part'),
])  # fmt: skip
def test_config_errors(gannet, body, message):
    err = config_error(gannet, body)
    assert message in err, err
    assert re.search(r"check\.conf:\d+: ", err), err


def test_low_address_bits_are_a_notice(gannet):
    r = gannet.check(server="allow 10.0.0.1/8; deny 2001:db8::1/32; location / { limit_except get { } }")
    assert r.returncode == 0, r.stderr
    assert "low address bits of 10.0.0.1/8 are meaningless" in r.stderr
    assert "low address bits of 2001:db8::1/32 are meaningless" in r.stderr


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_same_answers_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in SENT]
    diffs = []
    for r, (a_n, a_g) in zip(SENT, answers):
        n, got = normalise(a_n, nginx_port), normalise(a_g, srv.port)
        if r.startswith(b"HEAD ") and n.fields["status"] >= 400:
            # A built-in page's length differs by the server's name, and HEAD has no body
            # in which to normalise it.
            n.fields.pop("content-length")
            got.fields.pop("content-length")
        if (n.fields, n.body) != (got.fields, got.body):
            line = r.split(b"\r\n")[0].decode()
            diffs.append(f"{line}: nginx {n.fields['status']} {n.body[:80]!r}, gannet {got.fields['status']} {got.body[:80]!r}")
    statuses = {a_n.status for a_n, _ in answers}
    assert {200, 403, 405} <= statuses, statuses
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
