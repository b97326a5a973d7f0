"""`set_real_ip_from`, `real_ip_header`, `real_ip_recursive`: one config on gannet and
Debian's nginx, requests from several loopback addresses with X-Forwarded-For, X-Real-IP
and a custom header, and every answer compared - `$remote_addr`, `$remote_port`,
`$realip_remote_addr`, `$realip_remote_port`, a `geo` of the client, `allow`/`deny` by the
real address, `$proxy_add_x_forwarded_for` - and the access logs line by line.
"""

from __future__ import annotations

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange_from, parse, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

SHOW = r'"$status $remote_addr|$remote_port|$realip_remote_addr|$realip_remote_port|$g|$proxy_add_x_forwarded_for\n"'

CONF = PEER_MAIN + r"""
http {
    log_format real '$remote_addr $realip_remote_addr $status $request_uri';
    access_log {tmp}/access.log real;
    geo $g { default d; 192.168.0.0/16 lan; 127.0.0.0/8 lo; 10.0.0.0/8 ten; }
    # Server level: applied before the server's rewrites, so the locations' settings
    # below it never get a say.
    server {
        listen 127.0.0.1:{port};
        server_name a;
        set_real_ip_from 127.0.0.2;
        set_real_ip_from 10.0.0.0/8;
        real_ip_header X-Forwarded-For;
        location / { return 200 SHOW; }
        location /rec/ { real_ip_recursive on; return 200 SHOW; }
        # `return` would answer before the access phase: a file is served instead.
        location /deny/ { root {root}; deny 192.168.0.0/16; }
        location /moved/ { rewrite ^ /deny/f.txt last; }
    }
    # Location level only.
    server {
        listen 127.0.0.1:{port};
        server_name b;
        location / { return 200 SHOW; }
        location /rec/ {
            set_real_ip_from 127.0.0.2;
            set_real_ip_from 10.0.0.0/8;
            real_ip_header X-Forwarded-For;
            real_ip_recursive on;
            return 200 SHOW;
        }
        location /xreal/ { set_real_ip_from 127.0.0.0/24; return 200 SHOW; }
        location /custom/ {
            set_real_ip_from 127.0.0.2;
            real_ip_header CF-Connecting-IP;
            return 200 SHOW;
        }
        location /deny/ {
            set_real_ip_from 127.0.0.2;
            real_ip_header X-Forwarded-For;
            root {root};
            allow 10.0.0.0/8;
            deny all;
        }
    }
}
""".replace("SHOW", SHOW)


def get(port: int, host: str, path: str, source: str, headers: tuple = ()) -> bytes:
    """GET from `source`; the connection's own port is shown as PEER (it differs per run)."""
    extra = "".join(f"{n}: {v}\r\n" for n, v in headers)
    raw, own = exchange_from(port, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode(), source)
    a = parse(raw)
    if a.status != 200:
        return str(a.status).encode()
    return re.sub(rb"\b%d\b" % own, b"PEER", a.body)


XFF = "X-Forwarded-For"
CASES = [
    ("a", "/", "127.0.0.1", ((XFF, "192.168.5.5"),)),  # not trusted
    ("a", "/", "127.0.0.2", ()),  # no header
    ("a", "/", "127.0.0.2", ((XFF, "192.168.5.5"),)),
    ("a", "/", "127.0.0.2", ((XFF, "192.168.5.5:4321"),)),
    ("a", "/", "127.0.0.2", ((XFF, "192.168.5.5, 10.1.1.1"),)),
    ("a", "/rec/", "127.0.0.2", ((XFF, "192.168.5.5, 10.1.1.1"),)),
    ("a", "/", "127.0.0.2", ((XFF, "junk"),)),
    ("a", "/", "127.0.0.2", ((XFF, "[2001:db8::1]:99"),)),
    ("a", "/", "127.0.0.2", ((XFF, "10.9.9.9"), (XFF, "192.168.1.1"))),
    ("a", "/deny/f.txt", "127.0.0.2", ((XFF, "192.168.5.5"),)),
    ("a", "/deny/f.txt", "127.0.0.2", ((XFF, "10.5.5.5"),)),
    ("a", "/moved/", "127.0.0.2", ((XFF, "192.168.5.5"),)),
    ("b", "/", "127.0.0.2", ((XFF, "192.168.5.5"),)),
    ("b", "/rec/", "127.0.0.2", ((XFF, "192.168.5.5, 10.1.1.1"),)),
    ("b", "/rec/", "127.0.0.2", ((XFF, "192.168.5.5, 10.1.1.1, 10.2.2.2"),)),
    ("b", "/rec/", "127.0.0.2", ((XFF, "junk, 10.1.1.1"),)),
    ("b", "/xreal/", "127.0.0.3", (("X-Real-IP", "192.168.9.9"),)),
    ("b", "/xreal/", "127.0.0.3", (("X-Real-IP", "192.168.9.9"), ("X-Real-IP", "10.3.3.3"))),
    ("b", "/xreal/", "127.0.0.3", ((XFF, "192.168.9.9"),)),
    ("b", "/custom/", "127.0.0.2", (("CF-Connecting-IP", "192.168.4.4"),)),
    ("b", "/deny/f.txt", "127.0.0.2", ((XFF, "10.5.5.5"),)),
    ("b", "/deny/f.txt", "127.0.0.2", ((XFF, "192.168.5.5"),)),
    ("b", "/deny/f.txt", "127.0.0.1", ((XFF, "10.5.5.5"),)),
]


def test_real_ip_is_nginx_real_ip(tmp_path):
    with side_by_side(tmp_path, CONF, {"deny/f.txt": "let in\n"}) as (srv, nginx_port):
        answers = set()
        for host, path, source, headers in CASES:
            ours = get(srv.port, host, path, source, headers)
            assert ours == get(nginx_port, host, path, source, headers), (host, path, source, headers)
            answers.add(ours)
        # Distinct outcomes: the comparison is not of a config that changes nothing.
        assert len(answers) >= 14, answers
        assert get(srv.port, "a", "/", "127.0.0.2", ((XFF, "192.168.5.5:4321"),)) == (
            b"200 192.168.5.5|4321|127.0.0.2|PEER|lan|192.168.5.5:4321, 192.168.5.5\n"
        )
        assert get(srv.port, "a", "/deny/f.txt", "127.0.0.2", ((XFF, "192.168.5.5"),)) == b"403"
        assert get(srv.port, "a", "/deny/f.txt", "127.0.0.2", ((XFF, "10.5.5.5"),)) == b"let in\n"
        srv.stop()
        ours = (srv.tmp / "access.log").read_text().splitlines()
        theirs = (tmp_path / "nginx" / "access.log").read_text().splitlines()
        assert len(ours) == len(CASES) + 3
        assert ours[: len(CASES)] == theirs


@pytest.mark.parametrize(
    "stmt,message",
    [
        ("set_real_ip_from 10.0.0.0/33;", 'host not found in set_real_ip_from "10.0.0.0/33"'),
        ("real_ip_header X-Real-IP; real_ip_header X-Forwarded-For;", '"real_ip_header" directive is duplicate'),
        ("real_ip_recursive maybe;", "invalid value"),
        ("real_ip_header a b;", 'invalid number of arguments in "real_ip_header" directive'),
    ],
)
def test_bad_settings_are_config_errors(tmp_path, stmt, message):
    n, g = check_both(tmp_path, f"server {{ listen 127.0.0.1:2; {stmt} }}")
    assert n.returncode != 0 and message in n.stderr, n.stderr
    assert g.returncode != 0 and re.search(r"check\.conf:\d+: .*" + re.escape(message), g.stderr), g.stderr


def test_low_bits_warning_and_unix(tmp_path):
    n, g = check_both(tmp_path, "set_real_ip_from 10.1.2.3/8; set_real_ip_from unix:;")
    assert n.returncode == 0 and g.returncode == 0, (n.stderr, g.stderr)
    assert "low address bits of 10.1.2.3/8 are meaningless" in n.stderr
    assert re.search(r"check\.conf:\d+: low address bits of 10\.1\.2\.3/8 are meaningless", g.stderr), g.stderr
