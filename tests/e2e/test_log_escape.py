"""`log_format ... escape=default|json|none`: gannet and Debian's nginx log the same requests
(headers holding quotes, backslashes, control bytes, UTF-8, absent headers) through the three
escapings, and the access-log files must be equal byte for byte.
"""

from __future__ import annotations

import re

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

# `$arg_i` first: the lines are sorted by it, whatever order the two servers wrote them in.
FIELDS = '$arg_i "$http_x_a" "$http_user_agent" "$http_x_missing" $request_uri $uri $status $sent_http_x_back'
CONF = PEER_MAIN + r"""
http {
    log_format dflt escape=default 'D FIELDS';
    log_format plain 'P FIELDS';
    log_format js escape=json '{"i":"$arg_i","a":"$http_x_a","ua":"$http_user_agent","none":"$http_x_missing","uri":"$request_uri","path":"$uri","back":"$sent_http_x_back"}';
    log_format raw escape=none 'N FIELDS';
    server {
        listen 127.0.0.1:{port};
        access_log {tmp}/default.log dflt;
        access_log {tmp}/plain.log plain;
        access_log {tmp}/json.log js;
        access_log {tmp}/none.log raw;
        location / { add_header X-Back "$http_x_a" always; return 200 "ok\n"; }
    }
}
""".replace("FIELDS", FIELDS)

VALUES = [
    b"plain",
    b'say "hi"',
    b"back\\slash and \\\"both\"",
    b"tab\there",
    "caf\u00e9 \u65e5\u672c \U0001f600".encode(),
    b"{\"json\": [1, 2]}",
    b"",
]


def requests() -> list[bytes]:
    out = []
    for i, v in enumerate(VALUES):
        out.append(b"GET /p?i=%d HTTP/1.1\r\nHost: t\r\nX-A: %s\r\nUser-Agent: ua/%d \"q\"\r\nConnection: close\r\n\r\n" % (i, v, i))
    n = len(VALUES)
    # No X-A or User-Agent at all; URIs with characters a log escapes: `$uri` is decoded, so
    # it carries the control bytes a header may not (gannet refuses them in a header value,
    # where nginx takes any byte but NUL, CR and LF).
    paths = [b"/p", b"/%22q%22\\x", b"/c%01%02%08%09%0A%0C%0D%1F%7F%C3%A9%E2%82%AC"]
    for j, path in enumerate(paths):
        out.append(b"GET %s?i=%d HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" % (path, n + j))
    return out


def records(path, n: int) -> list[bytes]:
    """The log's lines sorted by their `$arg_i`. escape=none leaves line ends inside values,
    so a line is cut only where a newline is followed by the start of the next one."""
    start = re.compile(rb'\n(?=[DPN] \d+ |\{"i":")')

    def read():
        data = path.read_bytes() if path.exists() else b""
        got = start.split(data.removesuffix(b"\n")) if data else []
        return len(got) >= n and got

    got = wait_until(read)
    assert got, f"{path} has fewer than {n} lines"
    return sorted(got, key=lambda r: int(re.match(rb'(?:[DPN] |\{"i":")(\d+)', r)[1]))


def test_access_log_escaping_matches_nginx(tmp_path):
    sent = requests()
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            for r in sent:
                assert exchange(port, r).status == 200
        for name in ("default", "plain", "json", "none"):
            g = records(srv.tmp / f"{name}.log", len(sent))
            n = records(tmp_path / "nginx" / f"{name}.log", len(sent))
            assert g == n, f"{name}.log differs:\n" + "\n".join(f"nginx  {a!r}\ngannet {b!r}" for a, b in zip(n, g) if a != b)
    # Not vacuous: each escaping changed something, and differently.
    assert b'\\x22hi\\x22' in b"".join(n for n in records(tmp_path / "nginx" / "default.log", len(sent)))
    js = b"".join(records(tmp_path / "nginx" / "json.log", len(sent)))
    assert b'say \\"hi\\"' in js and b"\\u0001" in js


def test_unknown_escaping_is_refused_as_nginx(tmp_path):
    n, g = check_both(tmp_path, "log_format bad escape=xml '$uri';")
    assert n.returncode != 0 and g.returncode != 0
    assert 'unknown log format escaping "xml"' in n.stderr
    assert 'unknown log format escaping "xml"' in g.stderr


RAW_CONF = PEER_MAIN + r"""
http {
    log_format rq '$arg_i "$request" "$http_user_agent" "$http_x_a"';
    server {
        listen 127.0.0.1:{port};
        access_log {tmp}/raw.log rq;
        location / { return 200 "ok\n"; }
    }
}
"""


def test_bytes_that_are_not_utf8_are_logged_as_received_as_nginx(tmp_path):
    # Latin-1 and stray bytes in headers (`$http_*`; `$request` takes the same path): each
    # byte is escaped as itself (`\xE9`, `\xFF`), not as a replacement character's UTF-8.
    sent = [
        b"GET /p?i=0 HTTP/1.1\r\nHost: t\r\nUser-Agent: caf\xe9 \xff\xfe\r\nX-A: \x80ok\r\nConnection: close\r\n\r\n",
        b"GET /p?i=1 HTTP/1.1\r\nHost: t\r\nUser-Agent: caf\xc3\xa9\r\nConnection: close\r\n\r\n",
    ]
    with side_by_side(tmp_path, RAW_CONF) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            for r in sent:
                assert exchange(port, r).status == 200
        start = re.compile(rb"\n(?=\d+ )")

        def lines(path):
            def read():
                data = path.read_bytes() if path.exists() else b""
                got = start.split(data.removesuffix(b"\n")) if data else []
                return len(got) >= len(sent) and sorted(got)

            got = wait_until(read)
            assert got, f"{path} has fewer than {len(sent)} lines"
            return got

        g, n = lines(srv.tmp / "raw.log"), lines(tmp_path / "nginx" / "raw.log")
    assert g == n, f"nginx  {n!r}\ngannet {g!r}"
    assert b'"caf\\xE9 \\xFF\\xFE" "\\x80ok"' in n[0]
    assert b'"caf\\xC3\\xA9" "-"' in n[1]


BINARY_CONF = PEER_MAIN + r"""
http {
    log_format bin 'B $binary_remote_addr|';
    log_format bin_raw escape=none 'N $binary_remote_addr|';
    log_format bin_json escape=json '{"a":"$binary_remote_addr"}';
    server {
        listen 127.0.0.1:{port};
        access_log {tmp}/bin.log bin;
        access_log {tmp}/bin.log bin_raw;
        access_log {tmp}/bin.log bin_json;
        location / { return 200 "ok\n"; }
    }
}
"""


def test_binary_remote_addr_is_logged_as_bytes_as_nginx(tmp_path):
    # nginx's four address bytes, escaped as any value (`\x7F\x00\x00\x01`), raw with
    # escape=none, \u-escaped in JSON; not the text address.
    with side_by_side(tmp_path, BINARY_CONF) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            assert exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").status == 200

        def read(path):
            return wait_until(lambda: path.exists() and path.read_bytes().count(b"\n") >= 3 and path.read_bytes())

        g, n = read(srv.tmp / "bin.log"), read(tmp_path / "nginx" / "bin.log")
    assert g == n
    assert b"B \\x7F\\x00\\x00\\x01|\n" in g and b"N \x7f\x00\x00\x01|\n" in g
