"""`geo` and `split_clients`: one config on gannet and Debian's nginx, and every value
compared - networks and ranges looked up from an argument, the client's own address (the
test connects from several loopback addresses), trusted proxies with X-Forwarded-For, plain
and recursive, and 400 split_clients keys (the MurmurHash2 shares must be nginx's to the
key). Config errors and warnings are compared with `nginx -t`'s, message and line.
"""

from __future__ import annotations

import re
import socket

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, parse, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    access_log off;
    geo $g_client {
        default none;
        127.0.0.0/24 lo24;
        127.0.0.2 two;
        ::1 lo6;
    }
    geo $arg_ip $g_net {
        default d;
        10.0.0.0/8 ten;
        10.1.0.0/16 ten-one;
        10.1.2.3/32 host;
        2001:db8::/32 doc;
        ::ffff:0:0/96 mapped;
        255.255.255.255 none-addr;
        192.168.1.0/24 lan;
        delete 192.168.1.0/24;
    }
    geo $arg_ip $g_nodefault {
        10.0.0.0/8 ten;
    }
    geo $arg_ip $g_ranges {
        ranges;
        default d;
        10.0.0.0-10.0.255.255 one;
        10.0.1.0-10.0.1.255 inner;
        10.0.0.0-10.0.0.127 low;
        10.1.0.0-10.2.0.255 wide;
        255.255.0.0-255.255.255.254 top;
    }
    geo $g_proxy {
        proxy 127.0.0.2;
        proxy 127.0.0.3/32;
        default d;
        10.0.0.0/8 ten;
        127.0.0.0/8 lo;
        192.168.0.0/16 lan;
    }
    geo $g_recursive {
        proxy 127.0.0.2;
        proxy 10.0.0.0/8;
        proxy_recursive;
        default d;
        10.0.0.0/8 ten;
        127.0.0.0/8 lo;
        192.168.0.0/16 lan;
    }
    split_clients "${arg_k}AAA" $variant {
        0.5%   .one;
        2.0%   .two;
        40%    a;
        10.25% b;
        *      c;
    }
    split_clients "$arg_k" $partial {
        30.12% x;
        20%     y;
    }
    server {
        listen 127.0.0.1:{port};
        listen [::1]:{port};
        location /net { return 200 "$g_net|$g_nodefault|$g_ranges\n"; }
        location /client { return 200 "$g_client|$g_proxy|$g_recursive\n"; }
        location /split { return 200 "$variant|$partial\n"; }
    }
}
"""


def get(port: int, path: str, source: str = "127.0.0.1", headers: tuple = (), family=socket.AF_INET) -> bytes:
    """GET over a connection from `source` (any 127/8 address reaches the server)."""
    target = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    extra = "".join(f"{n}: {v}\r\n" for n, v in headers)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.bind((source, 0))
        s.connect((target, port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode())
        chunks = []
        while b := s.recv(65536):
            chunks.append(b)
    a = parse(b"".join(chunks))
    assert a.status == 200, a.raw
    return a.body


ADDRESSES = [
    "10.9.9.9", "10.1.9.9", "10.1.2.3", "11.0.0.1", "192.168.1.5", "2001:db8::7", "2001:db9::7",
    "::ffff:10.1.2.3", "::1", "255.255.255.255", "not-an-address", "", "10.0.0.7", "10.0.0.200",
    "10.0.1.7", "10.0.2.7", "10.1.200.7", "10.2.0.7", "10.2.1.7", "9.0.0.1", "10.0.0.1:80",
]

CLIENTS = [
    ("127.0.0.1", ()),
    ("127.0.0.9", ()),
    ("127.0.0.2", ()),
    ("127.0.0.2", (("X-Forwarded-For", "192.168.5.5"),)),
    ("127.0.0.3", (("X-Forwarded-For", "10.1.1.1, 192.168.5.5"),)),
    ("127.0.0.2", (("X-Forwarded-For", "192.168.5.5, 10.1.1.1"),)),
    ("127.0.0.2", (("X-Forwarded-For", "192.168.5.5, 10.1.1.1, 10.2.2.2"),)),
    ("127.0.0.2", (("X-Forwarded-For", "junk"),)),
    ("127.0.0.2", (("X-Forwarded-For", "192.168.7.7:8080"),)),
    ("127.0.0.2", (("X-Forwarded-For", "10.3.3.3"),)),
    ("127.0.0.9", (("X-Forwarded-For", "192.168.5.5"),)),  # not a trusted proxy
    ("127.0.0.2", (("X-Forwarded-For", "192.168.5.5"), ("X-Forwarded-For", "10.1.1.1"))),
    ("127.0.0.2", (("X-Forwarded-For", "10.1.1.1"), ("X-Forwarded-For", "192.168.5.5"))),
]


def test_geo_values_are_nginx_values(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for ip in ADDRESSES:
            path = f"/net?ip={ip}"
            assert get(srv.port, path) == get(nginx_port, path), path
        seen = set()
        for source, headers in CLIENTS:
            ours = get(srv.port, "/client", source, headers)
            assert ours == get(nginx_port, "/client", source, headers), (source, headers)
            seen.add(ours)
        ours = get(srv.port, "/client", "::1", family=socket.AF_INET6)
        assert ours == get(nginx_port, "/client", "::1", family=socket.AF_INET6)
        # The cases above reach distinct values, so the comparison is not of defaults.
        assert len(seen) >= 6, seen
        assert get(srv.port, "/net?ip=10.1.2.3") == b"host|ten|wide\n"


def test_split_clients_shares_are_nginx_shares(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        counts: dict[bytes, int] = {}
        for k in range(400):
            path = f"/split?k=client{k}"
            ours = get(srv.port, path)
            assert ours == get(nginx_port, path), path
            counts[ours] = counts.get(ours, 0) + 1
        variants = {v.split(b"|")[0] for v in counts}
        assert {b"a", b"b", b"c"} <= variants, counts


BAD = [
    ("geo $g { 10.0.0.0/33 x; }", "invalid network"),
    ("geo $g { proxy nope; }", "invalid network"),
    ("geo $g { 10.0.0.0/8 x;\n ranges; }", "must be the first directive"),
    ("geo $g { ranges;\n 10.0.0.9-10.0.0.1 x; }", "invalid range"),
    ("geo $g { ranges;\n 10.0.0.0-255.255.255.255 x; }", "invalid range"),
    ("geo $g { ranges;\n 10.0.0.0-10.0.255.255 one;\n 10.0.1.0-10.0.1.255 two;\n 10.0.0.0-10.1.255.255 big; }", "overlaps"),
    ("geo $g { a b c; }", "invalid number of the geo parameters"),
    ("geo g { default x; }", "invalid variable name"),
    ("split_clients $arg_k $s { 60% a;\n 50% b; }", "percent total is greater than 100%"),
    ("split_clients $arg_k $s { * a;\n 1% b; }", "percent total is greater than 100%"),
    ("split_clients $arg_k $s { 0% a; }", "invalid percent value"),
    ("split_clients $arg_k $s { 5 a; }", "invalid percent value"),
    ("split_clients $arg_k $s { 5.123% a; }", "invalid percent value"),
    ("split_clients $arg_k s { 5% a; }", "invalid variable name"),
]

WARNED = """geo $g {
    default a;
    default b;
    10.1.2.3/8 x;
    10.0.0.0/8 y;
    delete 1.0.0.0/8;
}
geo $r {
    ranges;
    1.0.0.0-1.0.0.9 a;
    1.0.0.0-1.0.0.9 b;
    delete 2.0.0.0-2.0.0.1;
    default x;
    default y;
}
"""


def checked(tmp_path, http: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """`nginx -t` and `gannet -t` on one config: each one's (message, line) list."""
    n, g = check_both(tmp_path, http)
    theirs = [(m, int(line)) for m, line in re.findall(r"\[(?:emerg|warn)\] (?:\d+#\d+: )?(.*) in \S+:(\d+)", n.stderr)]
    ours = [(m, int(line)) for line, m in re.findall(r"\[(?:emerg|notice)\] \S+:(\d+): (.*)", g.stderr) if "has no effect in gannet" not in m]
    assert (n.returncode == 0) == (g.returncode == 0), (n.stderr, g.stderr)
    return theirs, ours


@pytest.mark.parametrize("http,message", BAD)
def test_bad_blocks_fail_as_in_nginx(tmp_path, http, message):
    theirs, ours = checked(tmp_path, http)
    assert theirs and message in theirs[-1][0], theirs
    assert ours == theirs[-1:], (ours, theirs)


def test_warnings_are_nginx_warnings(tmp_path):
    theirs, ours = checked(tmp_path, WARNED)
    assert len(theirs) == 8, theirs
    assert ours == theirs
