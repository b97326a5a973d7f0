"""`valid_referers` and `$invalid_referer` on gannet and Debian's nginx with one config:
the typical hotlink protection (`if ($invalid_referer) { return 403; }`) and the variable's
value for Referers with and without a scheme, ports, paths, wildcards, regexes, case and
server names.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        server_name main.test *.main.test;
        location /img/ {
            valid_referers none blocked server_names *.example.com example.org/pics/
                           www.shop.* ~\.trusted\.;
            if ($invalid_referer) { return 403; }
        }
        location /strict/ {
            valid_referers example.com;
            return 200 "[$invalid_referer]\n";
        }
        location /open/ { return 200 "[$invalid_referer]\n"; }
    }
}
"""

REFERERS = [None, "", "junk", "http://", "http://i.ru", "HTTPS://WWW.EXAMPLE.COM/x",
            "http://example.com/", "http://a.b.example.com:8080/p", "http://example.org/pics/1.png",
            "http://example.org/other", "http://example.org:81/pics/", "http://EXAMPLE.org/PICS/",
            "http://www.shop.de/", "http://shop.de/", "https://x.trusted.net/", "http://main.test/",
            "http://sub.main.test/a", "ftp://example.com/", "http://evil.com/?example.com"]  # fmt: skip


def req(path: str, referer: str | None) -> bytes:
    ref = "" if referer is None else f"Referer: {referer}\r\n"
    return f"GET {path} HTTP/1.1\r\nHost: main.test\r\n{ref}Connection: close\r\n\r\n".encode()


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_same_answers_as_nginx(tmp_path):
    files = {"img/a.png": "PNG", "strict/x": "", "open/x": ""}
    with side_by_side(tmp_path, CONF, files) as (srv, nginx_port):
        got = {}
        diffs = []
        for path in ["/img/a.png", "/strict/x", "/open/x"]:
            for r in REFERERS:
                n, g = exchange(nginx_port, req(path, r)), exchange(srv.port, req(path, r))
                got[(path, r)] = (g.status, g.body)
                gb = g.body.replace(b"<center>gannet</center>", b"<center>nginx</center>")
                if (n.status, n.body) != (g.status, gb):
                    diffs.append(f"{path} {r!r}: nginx {n.status} {n.body!r}, gannet {g.status} {g.body!r}")
    assert not diffs, "differences from nginx:\n" + "\n".join(diffs)
    # The rules must have both let through and refused.
    assert got[("/img/a.png", None)][0] == 200 and got[("/img/a.png", "junk")][0] == 200
    assert got[("/img/a.png", "http://evil.com/?example.com")][0] == 403
    assert got[("/img/a.png", "http://example.org/other")][0] == 403
    assert got[("/img/a.png", "http://sub.main.test/a")][0] == 200
    assert got[("/strict/x", "http://example.com/")][1] == b"[]\n"
    assert got[("/strict/x", None)][1] == b"[1]\n"
    assert got[("/open/x", "junk")][1] == b"[]\n"

